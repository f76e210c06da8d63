"""Retrieval heads, DuoAttention-style (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM
Inference with Retrieval and Streaming Heads"): per-KV-head gates, their distribution, and passkey
accuracy as heads are masked to streaming attention from the lowest gate up.

Definitions:

- **Streaming attention** of a query at absolute position p sees the `sink` first keys and the
  `recent` latest ones: key j is visible iff j <= p and (j < sink or j > p - recent). Full attention
  sees every j <= p. Both also respect the model's own mask (padding, sliding window) when it has one.
- **Gate.** Every full-attention layer's KV head g gets alpha_g in [0, 1]; each query head of g's group
  outputs alpha_g * full + (1 - alpha_g) * streaming. Installed through transformers' attention
  interface (`install_gates`), so any model whose attention modules dispatch on
  `config._attn_implementation` works (Llama, Qwen3, SmolLM3, Granite, OLMo, and the FA layers of
  converted hybrids; their recurrent mixers are untouched).
- **Training** (only the gates; every model weight frozen; DuoAttention's recipe): alpha starts at 1;
  loss = distillation + l1 * mean(alpha), distillation = mean over the positions that predict answer
  tokens and over the hidden dimension of (h_full - h_gated)^2, with h the last decoder hidden state
  (after the final norm) and h_full the same model with every gate at 1. (DuoAttention sums over the
  hidden dimension and the heads; means make `l1` independent of width and head count.) After every
  update alpha is projected back onto [0, 1] (clamped, as DuoAttention does), through the shared
  training loop's step hook.
- **Passkey data** (synthetic, from English text): a haystack slice of held-out English tokens with a
  needle " The pass key is K. Remember it. K is the pass key." inserted, then " What is the pass key?
  The pass key is" and the answer " K" (K = `n_digits` random digits). Every example has exactly
  `context_len` tokens. The needle lies after the sink and wholly before the recent window of the
  first answer-predicting position, so streaming attention alone cannot see it.
- **Accuracy**: teacher-forced greedy exact match of all answer tokens (identical to greedy decoding's
  exact match, since decoding produces the answer iff every answer token is the argmax given the
  previous ones); also the per-token accuracy and the mean answer-token NLL.
- **Masking curve**: heads sorted by (alpha, layer, kv_head) ascending; at step k the k lowest are set
  to pure streaming (alpha = 0) and all others to full attention (alpha = 1), DuoAttention's
  deployment binarisation; k = 0 is the unmodified model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from torch import nn

from hybridlab.errors import HybridlabError

DUO_IMPL = "hybridlab_duo"
IGNORE = -100
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"
ALPHA_SCHEMA = {"model": pl.String, "layer": pl.Int64, "kv_head": pl.Int64, "alpha": pl.Float64}
CURVE_SCHEMA = {"model": pl.String, "n_masked": pl.Int64, "frac_masked": pl.Float64, "masked_layer": pl.Int64,
                "masked_kv_head": pl.Int64, "masked_alpha": pl.Float64, "accuracy": pl.Float64,
                "token_accuracy": pl.Float64, "answer_nll": pl.Float64}


@dataclass(frozen=True)
class DuoConfig:
    """Streaming pattern and gate-training knobs (DuoAttention trains with lr 0.02 and a small l1)."""

    sink: int = 4
    recent: int = 32
    steps: int = 40
    micro_batch_size: int = 4
    lr: float = 0.02
    l1: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sink < 0 or self.recent < 1:
            raise HybridlabError(f"streaming attention needs sink >= 0 and recent >= 1, got {self.sink}, {self.recent}")
        if self.steps < 1 or self.micro_batch_size < 1 or not self.lr > 0 or self.l1 < 0:
            raise HybridlabError("DuoConfig: steps and micro_batch_size must be >= 1, lr > 0 and l1 >= 0")


def streaming_mask(q_len: int, kv_len: int, sink: int, recent: int, device=None) -> torch.Tensor:
    """Bool [q_len, kv_len]: causal sink + recent-window visibility (queries are the last q_len positions)."""
    p_Q = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    j_K = torch.arange(kv_len, device=device)[None, :]
    return (j_K <= p_Q) & ((j_K < sink) | (j_K > p_Q - recent))


def causal_mask(q_len: int, kv_len: int, device=None) -> torch.Tensor:
    p_Q = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    return torch.arange(kv_len, device=device)[None, :] <= p_Q


def duo_attention(query_BHTD: torch.Tensor, key_BGSD: torch.Tensor, value_BGSD: torch.Tensor,
                  alpha_G: torch.Tensor, *, scaling: float, sink: int, recent: int,
                  mask_B1TS: torch.Tensor | None = None) -> torch.Tensor:
    """alpha-mix of full and streaming attention per KV head; returns [B, T, H, D] (transformers layout)."""
    B, H, T, _ = query_BHTD.shape
    G, S = key_BGSD.shape[1], key_BGSD.shape[2]
    if H % G or alpha_G.shape != (G,):
        raise HybridlabError(f"{H} query heads, {G} KV heads and gates of shape {tuple(alpha_G.shape)} do not fit")
    k = key_BGSD.repeat_interleave(H // G, dim=1)
    v = value_BGSD.repeat_interleave(H // G, dim=1)
    full = causal_mask(T, S, query_BHTD.device)[None, None]
    if mask_B1TS is not None:
        full = full & mask_B1TS.bool()
    out_full = F.scaled_dot_product_attention(query_BHTD, k, v, attn_mask=full, scale=scaling)
    a_H = alpha_G.to(query_BHTD.dtype).repeat_interleave(H // G)[None, :, None, None]
    if bool((alpha_G == 1).all()) and not alpha_G.requires_grad:
        out = out_full  # every head is full attention: skip the streaming pass
    else:
        stream = full & streaming_mask(T, S, sink, recent, query_BHTD.device)[None, None]
        out_stream = F.scaled_dot_product_attention(query_BHTD, k, v, attn_mask=stream, scale=scaling)
        out = a_H * out_full + (1 - a_H) * out_stream
    return out.transpose(1, 2).contiguous()


class DuoGate(nn.Module):
    """Gates alpha [num_kv_heads] of one attention module; `override` (not a parameter) pins them."""

    def __init__(self, num_kv_heads: int, layer: int, sink: int, recent: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(num_kv_heads))
        self.layer, self.sink, self.recent = layer, sink, recent
        self.override: torch.Tensor | None = None

    def value(self) -> torch.Tensor:
        return self.override if self.override is not None else self.alpha.clamp(0.0, 1.0)


def _duo_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kw):
    """The attention function registered as DUO_IMPL (signature of transformers' attention interface)."""
    gate = getattr(module, "duo_gate", None)
    if gate is None:
        raise HybridlabError(f"attention layer {getattr(module, 'layer_idx', '?')} runs with the DuoAttention "
                             "implementation but has no gate; install gates with install_gates(model)")
    if sliding_window is not None and attention_mask is None:
        raise HybridlabError("DuoAttention gates on a sliding-window layer need its explicit mask; "
                             "gate full-attention layers only")
    out = duo_attention(query, key, value, gate.value(), scaling=module.scaling if scaling is None else scaling,
                        sink=gate.sink, recent=gate.recent, mask_B1TS=attention_mask)
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(DUO_IMPL, _duo_forward)
    # The same boolean 4D masks as sdpa (None for a plain causal batch): padding and windows are respected.
    AttentionMaskInterface.register(DUO_IMPL, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def attention_layers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(layer index, attention module) of every full-attention layer (a hybrid's FA layers only)."""
    from hybridlab.models.convert import MixerAttention
    from hybridlab.models.sites import find_decoder_layers

    _, layers = find_decoder_layers(model)
    spec = getattr(model, "hybridlab_spec", None)
    idx = spec.fa_layers if spec is not None else range(len(layers))
    out = []
    for i in idx:
        attn = getattr(layers[i], "self_attn", None)
        if attn is None or isinstance(attn, MixerAttention) or not hasattr(attn, "k_proj"):
            continue
        out.append((i, attn))
    if not out:
        raise HybridlabError(f"{type(model).__name__} has no full-attention layer with self_attn.k_proj to gate")
    return out


class DuoGates:
    """The gates installed on a model; `remove()` restores it."""

    def __init__(self, model: nn.Module, gates: list[DuoGate], previous_impl: str):
        self.model, self.gates, self._previous = model, gates, previous_impl

    def parameters(self) -> list[nn.Parameter]:
        return [g.alpha for g in self.gates]

    def heads(self) -> list[tuple[int, int]]:
        return [(g.layer, h) for g in self.gates for h in range(g.alpha.numel())]

    def alphas(self) -> torch.Tensor:
        """Current gates, clamped to [0, 1], flattened in `heads()` order."""
        return torch.cat([g.alpha.detach().clamp(0, 1) for g in self.gates]).cpu()

    def clamp_(self) -> None:
        with torch.no_grad():
            for g in self.gates:
                g.alpha.clamp_(0.0, 1.0)

    @contextmanager
    def pinned(self, values: torch.Tensor) -> Iterator[None]:
        """Temporarily use fixed gate values (flattened in `heads()` order) instead of alpha."""
        values = torch.as_tensor(values, dtype=torch.float32)
        if values.numel() != len(self.heads()):
            raise HybridlabError(f"{values.numel()} gate values for {len(self.heads())} heads")
        start = 0
        try:
            for g in self.gates:
                n = g.alpha.numel()
                g.override = values[start:start + n].to(g.alpha.device)
                start += n
            yield
        finally:
            for g in self.gates:
                g.override = None

    def full(self):
        return self.pinned(torch.ones(len(self.heads())))

    def remove(self) -> None:
        for _, attn in attention_layers(self.model):
            if hasattr(attn, "duo_gate"):
                del attn.duo_gate
        self.model.set_attn_implementation(self._previous)


def install_gates(model: nn.Module, *, sink: int, recent: int) -> DuoGates:
    """Attach a `duo_gate` (alpha = 1) to every full-attention module and switch the model to DUO_IMPL."""
    _register()
    config = model.config.get_text_config(decoder=True)
    n_kv = config.num_key_value_heads
    gates = []
    for i, attn in attention_layers(model):
        if hasattr(attn, "duo_gate"):
            raise HybridlabError(f"layer {i} already has DuoAttention gates; remove() them first")
        ref = attn.k_proj.weight
        gate = DuoGate(n_kv, i, sink, recent).to(device=ref.device, dtype=torch.float32)
        attn.duo_gate = gate
        gates.append(gate)
    previous = model.config._attn_implementation
    model.set_attn_implementation(DUO_IMPL)
    return DuoGates(model, gates, previous)


# ---- passkey data -------------------------------------------------------------------------------------------
def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def make_passkey_examples(tokenizer: Any, haystack_ids: np.ndarray, *, n: int, context_len: int, n_digits: int,
                          sink: int, recent: int, seed: int) -> dict[str, torch.Tensor]:
    """`n` passkey examples of exactly `context_len` tokens: input_ids [n, T], labels [n, T] (answer
    tokens labelled at their own positions, IGNORE elsewhere), needle_pos [n] (see module docstring)."""
    hay = np.asarray(haystack_ids, dtype=np.int64)
    rng = np.random.default_rng(seed)
    q_ids = _encode(tokenizer, QUESTION)
    ids_NT = torch.empty(n, context_len, dtype=torch.long)
    labels_NT = torch.full((n, context_len), IGNORE, dtype=torch.long)
    pos_N = torch.empty(n, dtype=torch.long)
    for i in range(n):
        key = "".join(str(d) for d in rng.integers(0, 10, n_digits))
        needle, answer = _encode(tokenizer, NEEDLE.format(key=key)), _encode(tokenizer, ANSWER.format(key=key))
        hay_len = context_len - len(needle) - len(q_ids) - len(answer)
        first_pred = context_len - len(answer) - 1  # position predicting the first answer token
        # needle [pos, pos + len) inside the haystack part and ending before the recent window
        hi = min(hay_len, first_pred - recent - len(needle) + 1)
        if hay_len < 1 or hi < sink or len(hay) < hay_len:
            raise HybridlabError(
                f"passkey examples of {context_len} tokens cannot hold sink={sink}, recent={recent}, a "
                f"{len(needle)}-token needle and the question (and the haystack text has {len(hay)} tokens); "
                "raise context_len or lower recent")
        start = int(rng.integers(0, len(hay) - hay_len + 1))
        pos = int(rng.integers(sink, hi + 1))
        chunk = hay[start:start + hay_len].tolist()
        seq = chunk[:pos] + needle + chunk[pos:] + q_ids + answer
        ids_NT[i] = torch.tensor(seq)
        labels_NT[i, context_len - len(answer):] = torch.tensor(answer)
        pos_N[i] = pos
    return {"input_ids": ids_NT, "labels": labels_NT, "needle_pos": pos_N}


class _Examples(torch.utils.data.Dataset):
    def __init__(self, examples: dict[str, torch.Tensor]):
        self.ids, self.labels = examples["input_ids"], examples["labels"]

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _last_hidden(model: nn.Module, ids_BT: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=ids_BT, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1]


def predicting_positions(labels_BT: torch.Tensor) -> torch.Tensor:
    """Bool [B, T]: position t predicts a labelled (answer) token at t + 1."""
    pred = torch.zeros_like(labels_BT, dtype=torch.bool)
    pred[:, :-1] = labels_BT[:, 1:] != IGNORE
    return pred


class DuoDistillTask:
    """The shared loop's task: distil the gated model's last hidden state into the full model's + l1 on alpha."""

    def __init__(self, gates: DuoGates, l1: float):
        self.gates, self.l1 = gates, l1

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        ids, pred_BT = batch["input_ids"], predicting_positions(batch["labels"])
        if not bool(pred_BT.any()):
            raise HybridlabError("passkey batch has no answer tokens; check the labels")
        with torch.no_grad(), self.gates.full():
            h_full = _last_hidden(model, ids)
        h = _last_hidden(model, ids)
        distill = (h.float() - h_full.float()).square().mean(-1)[pred_BT].mean()
        alpha = torch.cat([g.alpha.clamp(0, 1) for g in self.gates.gates])
        sparsity = alpha.mean()
        return distill + self.l1 * sparsity, {"duo/distill": distill.detach(), "duo/alpha_mean": sparsity.detach()}

    def num_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["input_ids"].numel())


def train_gates(model: nn.Module, examples: dict[str, torch.Tensor], cfg: DuoConfig, out_dir: str) -> DuoGates:
    """Install gates and train them (model weights frozen) with the shared loop; returns the gates."""
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train

    trainable = {n: p.requires_grad for n, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    gates = install_gates(model, sink=cfg.sink, recent=cfg.recent)
    tcfg = TrainConfig(out_dir=out_dir, steps=cfg.steps, micro_batch_size=cfg.micro_batch_size, lr=cfg.lr,
                       schedule="constant", weight_decay=0.0, grad_clip=None, betas=(0.9, 0.999),
                       seed=cfg.seed, log_every=max(1, cfg.steps // 10), keep_last_k=1, progress=False)
    try:
        train(model, DuoDistillTask(gates, cfg.l1), _Examples(examples), tcfg,
              on_step_start=lambda step, m, opt: gates.clamp_(), restart=True)
    finally:
        gates.clamp_()
        for n, p in model.named_parameters():
            p.requires_grad_(trainable.get(n, False))
    model.eval()
    return gates


# ---- evaluation -----------------------------------------------------------------------------------------------
@torch.no_grad()
def passkey_accuracy(model: nn.Module, examples: dict[str, torch.Tensor], batch_size: int = 8) -> dict[str, float]:
    """Exact-match accuracy, per-token accuracy and mean answer NLL (teacher-forced, greedy)."""
    from hybridlab.train.losses import answer_accuracy

    dev = next(model.parameters()).device
    ids, labels = examples["input_ids"], examples["labels"]
    right = tok_right = nll = n_tok = 0.0
    for s in range(0, ids.shape[0], batch_size):
        x, y = ids[s:s + batch_size].to(dev), labels[s:s + batch_size].to(dev)
        logits = model(input_ids=x, use_cache=False).logits[:, :-1].float()
        target = y[:, 1:]
        n = x.shape[0]
        right += float(answer_accuracy(logits, target, IGNORE, per_sequence=True)) * n
        valid = target != IGNORE
        k = int(valid.sum())
        tok_right += float(answer_accuracy(logits, target, IGNORE, per_sequence=False)) * k
        nll += float(F.cross_entropy(logits[valid], target[valid], reduction="sum"))
        n_tok += k
    return {"accuracy": right / ids.shape[0], "token_accuracy": tok_right / n_tok, "answer_nll": nll / n_tok}


def alpha_table(gates: DuoGates, model_name: str) -> pl.DataFrame:
    rows = [{"model": model_name, "layer": layer, "kv_head": h, "alpha": float(a)}
            for (layer, h), a in zip(gates.heads(), gates.alphas().tolist())]
    return pl.DataFrame(rows, schema=ALPHA_SCHEMA)


def masking_order(gates: DuoGates) -> list[int]:
    """Head indices (into `heads()`) from the lowest alpha up; ties by (layer, kv_head)."""
    heads, alphas = gates.heads(), gates.alphas().tolist()
    return sorted(range(len(heads)), key=lambda i: (alphas[i], heads[i][0], heads[i][1]))


def masking_curve(model: nn.Module, gates: DuoGates, examples: dict[str, torch.Tensor], model_name: str,
                  batch_size: int = 8) -> pl.DataFrame:
    """Accuracy with the k lowest-alpha heads streaming and the rest full, k = 0..n_heads."""
    heads, alphas, order = gates.heads(), gates.alphas().tolist(), masking_order(gates)
    rows = []
    for k in range(len(heads) + 1):
        values = torch.ones(len(heads))
        values[order[:k]] = 0.0
        with gates.pinned(values):
            acc = passkey_accuracy(model, examples, batch_size)
        last = order[k - 1] if k else None
        rows.append({"model": model_name, "n_masked": k, "frac_masked": k / len(heads),
                     "masked_layer": heads[last][0] if last is not None else None,
                     "masked_kv_head": heads[last][1] if last is not None else None,
                     "masked_alpha": alphas[last] if last is not None else None, **acc})
    return pl.DataFrame(rows, schema=CURVE_SCHEMA)


def analyse_retrieval_heads(model: nn.Module, train_examples: dict[str, torch.Tensor],
                            test_examples: dict[str, torch.Tensor], cfg: DuoConfig, *, model_name: str,
                            out_dir: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Train the gates on `train_examples`, then (alpha rows, masking curve on `test_examples`)."""
    gates = train_gates(model, train_examples, cfg, out_dir)
    try:
        return alpha_table(gates, model_name), masking_curve(model, gates, test_examples, model_name,
                                                              batch_size=2 * cfg.micro_batch_size)
    finally:
        gates.remove()


# --- the retrieval-head tables of the eval_retrieval_heads rule ------------------------------------------

def retrieval_heads_tables(models: Sequence[str | Path], params: "RetrievalHeadsJob | dict", *, mixture: str | Path,
                           tokenizer: str | Path, work: str | Path, log: Callable[[str], None] = print
                           ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(alpha table, masking curve) of every BLD natural-language arm directory in `models` (the
    eval_retrieval_heads rule; workflow_scripts/eval_retrieval_heads.py).

    Passkey examples are built from the held-out English text of the packed English mixture directory
    `mixture` (its val rows, contiguous text) with the tokenizer directory `tokenizer`: `n_train` to train
    the gates (seed `seed`), `n_test` (seed `seed` + 1: other haystack slices and keys) for the masking
    curve; the same examples for every arm. `params`: the job's section
    (`hybridlab.config_spec.RetrievalHeadsJob`, or its dict). Each arm's gate training runs in `work`/<arm name>; torch is seeded with
    `seed` before each arm is loaded.

    Alpha: model, layer, kv_head, alpha, mixer, size, variant. Curve: model, n_masked, frac_masked,
    masked_layer, masked_kv_head, masked_alpha, accuracy, token_accuracy, answer_nll, mixer, size,
    variant, n (the test examples behind each accuracy). Arm columns: `pairs.arm_columns`.
    """
    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.eval.pairs import arm_columns
    from hybridlab.models.registry import load_causal_lm
    from hybridlab.data.packed_dataset import val_stream

    from hybridlab.config_spec import RetrievalHeadsJob, job_settings

    job = job_settings(RetrievalHeadsJob, params, "eval_retrieval_heads.py")
    cfg_in, seed = job.retrieval_heads, job.seed
    duo = DuoConfig(sink=cfg_in.sink, recent=cfg_in.recent, steps=cfg_in.steps,
                    micro_batch_size=cfg_in.micro_batch_size, lr=cfg_in.lr, l1=cfg_in.l1, seed=seed)
    tok = load_tokenizer(str(tokenizer))
    hay = val_stream(str(mixture))
    common = dict(context_len=cfg_in.context_len, n_digits=cfg_in.n_digits, sink=duo.sink, recent=duo.recent)
    train_ex = make_passkey_examples(tok, hay, n=cfg_in.n_train, seed=seed, **common)
    test_ex = make_passkey_examples(tok, hay, n=cfg_in.n_test, seed=seed + 1, **common)
    log(f"passkey: {cfg_in.n_train} train / {cfg_in.n_test} test examples of {cfg_in.context_len} "
        f"tokens; streaming = {duo.sink} sink + {duo.recent} recent tokens")

    alpha_tables, curves = [], []
    for model_dir in map(str, models):
        name = Path(model_dir).name
        meta = arm_columns(model_dir, name)
        torch.manual_seed(seed)
        model = load_causal_lm(model_dir, dtype=job.dtype, device_map=job.device)
        alphas, curve = analyse_retrieval_heads(model, train_ex, test_ex, duo, model_name=name,
                                                out_dir=str(Path(work) / name))
        extra = [pl.lit(meta[k]).cast(pl.String).alias(k) for k in ("mixer", "size", "variant")]
        alpha_tables.append(alphas.with_columns(extra))
        # n: the passkey test examples behind each accuracy (the figure's Wilson intervals)
        curves.append(curve.with_columns(*extra, n=pl.lit(int(test_ex["input_ids"].shape[0]), pl.Int64)))
        full, masked = curve["accuracy"][0], curve["accuracy"][-1]
        log(f"{name}: alpha {[round(a, 3) for a in alphas['alpha'].to_list()]}; passkey accuracy "
            f"{full:.3f} full -> {masked:.3f} all heads streaming; answer NLL {curve['answer_nll'][0]:.3f} -> "
            f"{curve['answer_nll'][-1]:.3f}")
    return pl.concat(alpha_tables), pl.concat(curves)
