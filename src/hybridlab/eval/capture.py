"""Capture per-token hidden states and token-mixer residual contributions from any causal LM.

Definitions:

- `hidden[l]`: the model's `output_hidden_states[l]` (Hugging Face convention): l = 0 is the embedding
  output, l = 1..L the residual stream after decoder layer l-1. In transformers the LAST entry (l = L)
  is taken after the final norm, so it is not on the same scale as the others.
- `attn_delta[l]` (l = 0..L-1, decoder-layer index): what decoder layer l's token-mixing sub-block adds
  to the residual stream, h_mid = h_in + attn_delta. It is captured with a forward hook on the module
  that `hybridlab.models.sites.find_mixer_sites` names for layer l (the layer's token mixer, or the
  post-attention norm of post-norm layers), scaled by the layer's residual multiplier. A tuple output
  (attention modules return `(out, weights)`) contributes its first element.

Tokens: sentences are tokenised one by one (no truncation), right-padded into batches sorted by length
(right padding never changes a causal model's real tokens, for attention and recurrent mixers alike)
and padding is removed. With a tokenizer, special-token positions (BOS/EOS...) go through the model but
are dropped from the captured sets unless `keep_special_tokens`; they carry no sentence content and
their near-constant states would inflate cross-sentence similarity.

Layout (documented choice): one flat float32 CPU tensor [T_total, D] per layer plus shared `offsets`
[N+1]; sentence i is rows offsets[i]:offsets[i+1] in the caller's order. Each batch is moved to CPU as
float32 right after its forward, so the corpus never sits on the accelerator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.models.sites import MIXER_NAMES, find_decoder_layers, find_mixer_sites


@dataclass
class CaptureResult:
    """Per-layer token vectors, padding removed, as flat [T_total, D] float32 CPU tensors + offsets."""

    offsets: torch.Tensor  # [N+1] int64; sentence i = rows offsets[i]:offsets[i+1]
    token_ids: torch.Tensor  # [T_total] int64, the ids of the kept tokens
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # hidden-state index -> [T_total, D]
    attn_delta: dict[int, torch.Tensor] = field(default_factory=dict)  # decoder layer -> [T_total, D]
    mixers: dict[int, str] = field(default_factory=dict)  # decoder layer -> mixer attribute name
    n_layers: int = 0  # decoder layers L (hidden has indices 0..L)

    @property
    def n_sentences(self) -> int:
        return self.offsets.numel() - 1

    def flat(self, kind: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat [T_total, D], offsets) of `kind` in {"hidden", "attn_delta"} at `layer`."""
        store = {"hidden": self.hidden, "attn_delta": self.attn_delta}.get(kind)
        if store is None:
            raise HybridlabError(f"unknown capture kind {kind!r}; use 'hidden' or 'attn_delta'")
        if layer not in store:
            raise HybridlabError(f"layer {layer} of {kind} was not captured (have {sorted(store)}); "
                                 "pass it in layers=/delta_layers=")
        return store[layer], self.offsets

    def sets(self, kind: str, layer: int) -> list[torch.Tensor]:
        """Per-sentence [n_i, D] views of `kind` at `layer`."""
        flat, off = self.flat(kind, layer)
        return [flat[a:b] for a, b in zip(off[:-1].tolist(), off[1:].tolist())]


def _normalise_layers(layers: Sequence[int] | None, n: int, what: str) -> list[int]:
    if layers is None:
        return list(range(n))
    out = []
    for layer in layers:
        if not -n <= layer < n:
            raise HybridlabError(f"{what} index {layer} is out of range for {n} entries")
        out.append(layer % n)
    return sorted(set(out))


def _tokenise(tokenizer: Any, inputs: Sequence, add_special_tokens: bool, keep_special_tokens: bool):
    if len(inputs) == 0:
        raise HybridlabError("capture got no sentences")
    if isinstance(inputs[0], str):
        if tokenizer is None:
            raise HybridlabError("sentences are strings but tokenizer is None; pass the model's tokenizer "
                                 "or token-id lists")
        ids = tokenizer(list(inputs), add_special_tokens=add_special_tokens)["input_ids"]
        special = set() if keep_special_tokens else set(tokenizer.all_special_ids)
    else:
        ids = [list(map(int, s)) for s in inputs]
        special = set()
    keeps = []
    for i, s in enumerate(ids):
        keep = [t not in special for t in s]
        if not any(keep):
            raise HybridlabError(f"sentence {i} has no (non-special) tokens; drop empty sentences first")
        keeps.append(keep)
    return ids, keeps


def capture_hidden_states(model: nn.Module, tokenizer: Any, inputs: Sequence[str] | Sequence[Sequence[int]], *,
                          layers: Sequence[int] | None = None, delta_layers: Sequence[int] | None = None,
                          device: str | torch.device | None = None, batch_size: int = 16,
                          with_attn_delta: bool = True, add_special_tokens: bool = True,
                          keep_special_tokens: bool = False,
                          mixer_names: Sequence[str] | None = None) -> CaptureResult:
    """Run `model` over sentences (strings with a tokenizer, or token-id lists) and capture token vectors.

    `layers`: hidden-state indices 0..L (None = all); `delta_layers`: decoder-layer indices 0..L-1 for
    `attn_delta` (None = all; ignored unless with_attn_delta). `device`: where the model lives (default:
    its parameters' device); the model is not moved.
    """
    if batch_size < 1:
        raise HybridlabError(f"batch_size must be >= 1, got {batch_size}")
    model_device = next(model.parameters()).device
    dev = torch.device(device) if device is not None else model_device
    if dev.type != model_device.type or (dev.index is not None and dev.index != model_device.index):
        raise HybridlabError(f"model is on {model_device} but device={dev}; call model.to(device) first")
    sites = find_mixer_sites(model, mixer_names)
    n_layers = len(sites)
    hidden_layers = _normalise_layers(layers, n_layers + 1, "hidden-state layer")
    site_layers = _normalise_layers(delta_layers, n_layers, "decoder layer") if with_attn_delta else []
    ids, keeps = _tokenise(tokenizer, inputs, add_special_tokens, keep_special_tokens)

    kept_N = torch.tensor([sum(k) for k in keeps], dtype=torch.long)
    offsets = torch.zeros(len(ids) + 1, dtype=torch.long)
    offsets[1:] = kept_N.cumsum(0)
    token_ids = torch.tensor([t for s, k in zip(ids, keeps) for t, kk in zip(s, k) if kk], dtype=torch.long)
    result = CaptureResult(offsets=offsets, token_ids=token_ids, n_layers=n_layers,
                           mixers={s.layer: s.mixer_name for s in sites})

    _, decoder = find_decoder_layers(model, tuple(mixer_names) if mixer_names is not None else MIXER_NAMES)
    captured: dict[int, torch.Tensor] = {}
    handles = []
    for layer in site_layers:
        site = sites[layer]

        def hook(_module, _args, output, layer=layer, scale=site.scale):
            out = output[0] if isinstance(output, (tuple, list)) else output
            captured[layer] = out.detach() * scale if scale != 1.0 else out.detach()

        handles.append(getattr(decoder[layer], site.hooked).register_forward_hook(hook))

    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # length-sorted batches: little padding
    was_training = model.training
    model.eval()
    try:
        for b0 in range(0, len(order), batch_size):
            batch = order[b0:b0 + batch_size]
            t_max = max(len(ids[i]) for i in batch)
            input_BT = torch.zeros(len(batch), t_max, dtype=torch.long)
            attn_BT = torch.zeros(len(batch), t_max, dtype=torch.long)
            keep_BT = torch.zeros(len(batch), t_max, dtype=torch.bool)
            for r, i in enumerate(batch):
                input_BT[r, :len(ids[i])] = torch.tensor(ids[i])
                attn_BT[r, :len(ids[i])] = 1
                keep_BT[r, :len(ids[i])] = torch.tensor(keeps[i])
            # destination rows of the kept tokens, in the same (row-major) order as tensor[keep_BT]
            dest = torch.cat([torch.arange(int(offsets[i]), int(offsets[i + 1])) for i in batch])
            captured.clear()
            with torch.inference_mode():
                out = model(input_ids=input_BT.to(dev), attention_mask=attn_BT.to(dev),
                            output_hidden_states=bool(hidden_layers), use_cache=False)
            if hidden_layers:
                hs = out.hidden_states
                if hs is None or len(hs) != n_layers + 1:
                    raise HybridlabError(f"model returned {None if hs is None else len(hs)} hidden states, "
                                         f"expected {n_layers + 1} (embeddings + one per decoder layer)")
                for layer in hidden_layers:
                    _store(result.hidden, layer, hs[layer], keep_BT, dest, int(offsets[-1]))
            for layer in site_layers:
                if layer not in captured:
                    raise HybridlabError(f"the mixer hook of decoder layer {layer} never fired; the model "
                                         "does not call the module found at that layer")
                _store(result.attn_delta, layer, captured[layer], keep_BT, dest, int(offsets[-1]))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return result


def _store(store: dict[int, torch.Tensor], layer: int, h_BTD: torch.Tensor, keep_BT: torch.Tensor,
           dest: torch.Tensor, total: int) -> None:
    if h_BTD.dim() != 3 or h_BTD.shape[:2] != keep_BT.shape:
        raise HybridlabError(f"captured tensor of layer {layer} has shape {tuple(h_BTD.shape)}, expected "
                             f"[batch, tokens, D] = [{keep_BT.shape[0]}, {keep_BT.shape[1]}, D]")
    rows = h_BTD[keep_BT.to(h_BTD.device)].float().cpu()
    if layer not in store:
        store[layer] = torch.empty(total, rows.shape[1], dtype=torch.float32)
    store[layer][dest] = rows
