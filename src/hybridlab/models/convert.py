"""Convert a dense transformers causal LM into a hybrid (RADLADS / HALO style attention transfer).

Every decoder layer NOT in ``fa_layers`` gets its ``self_attn`` replaced by a :class:`MixerAttention`
wrapping a recurrent mixer from :func:`hybridlab.models.mixers.build_mixer`. The mixer inherits the
teacher attention's projections:

- ``q_proj`` and ``o_proj`` are copied (weights and biases);
- ``k_proj`` / ``v_proj`` have ``num_key_value_heads`` heads; each KV head is repeated for the
  ``num_attention_heads / num_key_value_heads`` query heads of its group (``repeat_interleave`` over
  heads, the same grouping as transformers' ``repeat_kv``), giving ``num_attention_heads`` heads;
- head_dim comes from the teacher config (``head_dim``, else hidden_size / num_attention_heads);
- everything else in the mixer (gates, beta, short convs, output norm) keeps the mixer's own
  (fla-style) initialisation, drawn in a forked RNG seeded per layer from ``(seed, layer index)``
  (`layer_seed`): layer i's new mixer is the same whichever other layers are converted, so one
  all-layers stage 1 can supply every placement's mixers (`hybridlab.train.distill.assemble`).

Short convolutions (``conv_init``): the inherited q/k/v pass through the mixer's depthwise causal short
convolution and then SiLU before the recurrence. With ``conv_init="random"`` (this function's default:
the init of fla's layers built from scratch) the kernel is ``nn.Conv1d``'s random init, so even the
pre-SiLU features mix each token with its 3 predecessors and the converted layer does not start from the
teacher's per-token q/k/v. ``conv_init="identity"`` sets each channel's kernel to (0, ..., 0, 1):
conv(x)_t = x_t exactly, so q/k/v start as the teacher's projections (SiLU still follows; it is part of
the mixer's feature map and is not removed). Conversion recipes differ here: fla-org's
hybrid-distillation GDN student turns the short convolution off (``use_short_conv=False`` through
``mixer_overrides``) and HALO's GDN has none. The pipeline converts with ``identity``, the best of the
three after a short stage 1 on SmolLM2-135M (docs/methods.md, "Conversion initialisation"). The option is
the MixerConfig field ``conv_init`` (recorded in hybrid.json); it draws the same random numbers either
way, so every other new parameter is initialised identically, and parameter names stay fla's.

q_norm / k_norm (Qwen3: RMSNorm over head_dim; OLMo-3: RMSNorm over the whole projection): GDN and KDA
L2-normalise q and k per head, and ``l2norm(w * x / rms(x)) = l2norm(w * x)`` whatever the RMS is
taken over, so the norm's only lasting effect on a head's direction is its per-channel gain ``w``.
``qk_norm="fold"`` (default) multiplies that gain into the copied q/k projection rows: per head, the
mixer's projected q/k then point exactly where the teacher's normalised q/k do. (The mixer's depthwise
short conv commutes with the gain; its SiLU feature map does not, so the mixer's features differ from
the teacher's either way - folding keeps the teacher's channel weighting going into them.)
``qk_norm="drop"`` copies the projections bit-identically and discards the gain. GLA does not
L2-normalise q/k, so for it "fold" keeps the gain but not the teacher's per-token RMS scale.

Granite: ``attention_multiplier`` is the softmax temperature (GraniteAttention's ``scaling``); it has
no counterpart in a linear mixer and is not transferred (mixers keep fla's K**-0.5 query scale).
Granite's residual/embedding/logits multipliers live outside ``self_attn`` and stay in force.
OLMo-3 sliding-window layers that become mixers simply lose the window (a mixer sees all history).

The result stays the teacher's transformers class: ``config.layer_types`` is untouched (the decoder
uses it to choose masks and RoPE); the hybrid layout lives in ``model.hybridlab_spec``
(:class:`HybridSpec`). Forward hooks on ``layers[i].self_attn`` see ``(y_BTD, None)`` for mixers and
``(y_BTD, attn_weights)`` for attention, so patching code treats both alike; ``outputs.attentions``
holds one entry per FA layer (as in transformers' native hybrids). Padding: the decoder's 2D
``attention_mask`` is captured by a forward pre-hook on the decoder stack and handed to the mixers
(transformers only passes each layer a 4D mask, or None for SDPA without padding).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.models.cache import mixer_cache_slot
from hybridlab.models.sites import decoder_layers_or_none
from hybridlab.models.placements import FULL_ATTENTION

TESTED_ARCHITECTURES = ("Qwen3ForCausalLM", "LlamaForCausalLM", "GraniteForCausalLM", "Olmo3ForCausalLM")
_PROJ_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")
# MixerConfig fields fixed by the teacher: overriding them would break weight inheritance.
_INHERITED_FIELDS = ("kind", "hidden_size", "num_heads", "head_k_dim", "head_v_dim", "qkv_bias", "o_bias")
QK_NORM_MODES = ("fold", "drop")


@dataclass
class HybridSpec:
    """What makes a model a hybrid: which layers keep attention and how the mixers are configured.

    ``extra`` is free-form provenance for callers (e.g. the placement scheme and ratio); it is saved in
    hybrid.json and restored by load_hybrid, never interpreted here.
    """

    fa_layers: list[int]
    mixer_kind: str
    mixer_config: dict
    num_layers: int
    qk_norm: str = "fold"
    seed: int = 0
    base_model: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def layer_types(self) -> list[str]:
        fa = set(self.fa_layers)
        return [FULL_ATTENTION if i in fa else self.mixer_kind for i in range(self.num_layers)]

    @property
    def mixer_layers(self) -> list[int]:
        fa = set(self.fa_layers)
        return [i for i in range(self.num_layers) if i not in fa]


class PaddingContext:
    """The current forward's 2D padding mask ([B, S], 1 real / 0 pad; None = no padding), shared by all mixers.

    Also its packed documents (``documents_BS``, one id per position; None = one sequence per row), derived
    exactly as transformers derives the block-diagonal attention mask from ``position_ids``, so the mixers
    and the attention layers of one hybrid cut at the same positions.
    """

    def __init__(self):
        self.mask_BS: torch.Tensor | None = None
        self.documents_BS: torch.Tensor | None = None
        self.active = False  # inside a decoder-stack forward (the hooks below set it)

    def mask_for(self, num_tokens: int) -> torch.Tensor | None:
        if self.mask_BS is None:
            return None
        if self.mask_BS.shape[1] < num_tokens:
            raise HybridlabError(
                f"attention_mask covers {self.mask_BS.shape[1]} positions but the input has {num_tokens}; "
                "pass a [batch, past + new tokens] mask"
            )
        return self.mask_BS[:, -num_tokens:]

    def documents_for(self, num_tokens: int) -> torch.Tensor | None:
        if self.documents_BS is None:
            return None
        if self.documents_BS.shape[1] != num_tokens:
            raise HybridlabError(f"position_ids cover {self.documents_BS.shape[1]} positions but the input has "
                                 f"{num_tokens}; pass one position per input token")
        return self.documents_BS


def packed_documents(position_ids: torch.Tensor | None, batch_size: int) -> torch.Tensor | None:
    """Document ids from packed ``position_ids`` (a new document wherever the position does not grow by 1).

    The rule of transformers' ``find_packed_sequence_indices`` (which turns the same ``position_ids``
    into the block-diagonal causal mask of the attention layers); None when every row is one sequence.
    """
    if position_ids is None or not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
        return None
    pos = position_ids.expand(batch_size, -1) if position_ids.shape[0] != batch_size else position_ids
    step = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
    docs = (step != 1).cumsum(-1)
    return None if bool((docs[:, -1] == 0).all()) else docs


class CapturePaddingMask:
    """Hooks on the decoder stack: `pre` stores its 2D attention_mask in a PaddingContext, `post` clears it.

    Clearing after every forward (also on errors) means a mixer called outside a decoder forward never
    sees a stale mask from an earlier batch; it then runs unmasked, like an attention module given no mask.
    """

    def __init__(self, context: PaddingContext):
        self.context = context

    def pre(self, module, args, kwargs):
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != 2):
            raise HybridlabError(
                "hybrid models need a 2D [batch, seq] attention_mask (1 real, 0 pad), not a 4D or precomputed mask"
            )
        # An all-ones mask means no padding; None lets the mixers take their unmasked path.
        self.context.mask_BS = None if mask is None or bool(mask.all()) else mask
        self.context.documents_BS = None
        self.context.active = True
        # transformers packs only without a 2D mask (so decoding with a mask never pays for this check)
        ref = kwargs.get("input_ids", args[0] if args else None)
        ref = ref if ref is not None else kwargs.get("inputs_embeds")
        docs = packed_documents(kwargs.get("position_ids"), ref.shape[0]) if mask is None and ref is not None else None
        if docs is not None:
            # nor with a cache: refuse rather than let the mixers cut where attention does not
            use_cache = kwargs.get("use_cache")
            if use_cache is None:
                use_cache = getattr(getattr(module, "config", None), "use_cache", False)
            if kwargs.get("past_key_values") is not None or kwargs.get("cache") is not None or use_cache:
                raise HybridlabError("packed position_ids (restarting per document) need use_cache=False and no "
                                     "cache: transformers ignores the packing when it builds a cache")
            self.context.documents_BS = docs
        return None

    def post(self, module, args, kwargs, output):
        self.context.mask_BS = None
        self.context.documents_BS = None
        self.context.active = False
        return None


class MixerAttention(nn.Module):
    """Stands in for ``self_attn``: the attention call signature adapted to a recurrent mixer.

    Returns ``(y_BTD, None)`` like an attention module that returns no weights; keeps the mixer's
    ``MixerState`` in the transformers cache slot of its layer (see hybridlab.models.cache).
    """

    def __init__(self, mixer: nn.Module, layer_idx: int, kind: str, padding: PaddingContext):
        super().__init__()
        self.mixer = mixer
        self.layer_idx = layer_idx
        self.kind = kind
        self.padding = padding

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        cache = cache if cache is not None else kwargs.get("past_key_values")
        num_tokens = hidden_states.shape[1]
        mask_BT = self.padding.mask_for(num_tokens)
        slot = mixer_cache_slot(cache, self.layer_idx) if cache is not None else None
        y_BTD, state = self.mixer(
            hidden_states,
            attention_mask_BT=mask_BT,
            state=slot.state if slot is not None else None,
            use_cache=slot is not None,
            document_ids_BT=self._documents(num_tokens, hidden_states.shape[0], kwargs.get("position_ids")),
        )
        if slot is not None:
            slot.update_state(state, num_tokens)
        return y_BTD, None

    def _documents(self, num_tokens: int, batch: int, position_ids) -> torch.Tensor | None:
        """Inside a decoder forward the stack's (transformers') packing decides; called alone, position_ids."""
        if self.padding.active:
            return self.padding.documents_for(num_tokens)
        return packed_documents(position_ids, batch)

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}, kind={self.kind!r}"


def _decoder_layers(model) -> tuple[nn.Module, nn.ModuleList]:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = decoder_layers_or_none(model) if decoder is not None else None
    if layers is None or not all(hasattr(getattr(layer, "self_attn", None), p) for layer in layers for p in _PROJ_NAMES):
        raise HybridlabError(
            f"cannot convert {type(model).__name__}: its decoder layers lack self_attn.{{q,k,v,o}}_proj; supported are "
            f"causal LMs with that layout ({', '.join(TESTED_ARCHITECTURES)} are tested)"
        )
    return decoder, layers


def hybrid_spec(model) -> HybridSpec:
    """The HybridSpec of a converted or loaded hybrid; raises for a plain model."""
    spec = getattr(model, "hybridlab_spec", None)
    if spec is None:
        raise HybridlabError(f"{type(model).__name__} is not a hybridlab hybrid; convert it with convert_to_hybrid first")
    return spec


def teacher_mixer_config(model, mixer_kind: str, overrides: dict | None = None):
    """MixerConfig matching the teacher's attention shapes and biases, plus user overrides of the free fields."""
    from hybridlab.models.mixers import MixerConfig

    config = model.config.get_text_config(decoder=True)
    _, layers = _decoder_layers(model)
    attn = layers[0].self_attn
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    base = MixerConfig(
        kind=mixer_kind,
        hidden_size=config.hidden_size,
        num_heads=num_heads,
        head_k_dim=head_dim,
        head_v_dim=head_dim,
        qkv_bias=attn.q_proj.bias is not None,
        o_bias=attn.o_proj.bias is not None,
    )
    overrides = dict(overrides or {})
    names = {f.name for f in dataclasses.fields(MixerConfig)}
    unknown = sorted(set(overrides) - names)
    fixed = sorted(set(overrides) & set(_INHERITED_FIELDS))
    if unknown or fixed:
        free = sorted(names - set(_INHERITED_FIELDS))
        bad = f"unknown {unknown}" if unknown else f"teacher-determined {fixed}"
        raise HybridlabError(f"mixer_overrides has {bad} fields; you may override only {free}")
    return dataclasses.replace(base, **overrides)


def layer_seed(seed: int, layer: int) -> int:
    """The RNG seed of layer `layer`'s new mixer in a conversion seeded `seed` (independent of the placement)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, layer]).generate_state(1, dtype=np.uint64)[0]) & ((1 << 63) - 1)


def apply_hybrid_structure(model, spec: HybridSpec, on_swap=None) -> list[MixerAttention]:
    """Swap in freshly initialised mixers at spec.mixer_layers (in place) and install the padding hook.

    `on_swap(wrapper, old_attention)`, if given, runs right after each swap, before the next mixer is
    built (conversion inherits the projections there, so a replaced attention is freed before the next
    mixer exists); it must not draw random numbers, or the later mixers' initialisation would change.
    """
    from hybridlab.models.mixers import MixerConfig, build_mixer

    decoder, layers = _decoder_layers(model)
    if len(layers) != spec.num_layers:
        raise HybridlabError(
            f"hybrid spec is for {spec.num_layers} layers but {type(model).__name__} has {len(layers)}; "
            "use the base config the hybrid was made from"
        )
    mixer_cfg = MixerConfig(**spec.mixer_config)
    ref = layers[0].self_attn.q_proj.weight
    padding = PaddingContext()
    wrappers = []
    with torch.random.fork_rng(devices=[]):
        for idx in spec.mixer_layers:
            torch.manual_seed(layer_seed(spec.seed, idx))
            mixer = build_mixer(mixer_cfg, idx).to(device=ref.device, dtype=ref.dtype)
            wrapper = MixerAttention(mixer, idx, spec.mixer_kind, padding)
            old, layers[idx].self_attn = layers[idx].self_attn, wrapper
            if on_swap is not None:
                on_swap(wrapper, old)
            del old
            wrappers.append(wrapper)
    capture = CapturePaddingMask(padding)
    decoder.register_forward_pre_hook(capture.pre, with_kwargs=True)
    decoder.register_forward_hook(capture.post, with_kwargs=True, always_call=True)
    model.hybridlab_spec = spec
    return wrappers


def _norm_gain(attn, norm_name: str, num_heads: int, head_dim: int) -> torch.Tensor | None:
    """Per-output-row gain of a q/k RMSNorm ([num_heads * head_dim]), or None if the attention has none."""
    norm = getattr(attn, norm_name, None)
    if norm is None:
        return None
    weight = getattr(norm, "weight", None)
    if weight is None:
        raise HybridlabError(f"{type(attn).__name__}.{norm_name} has no weight; use qk_norm='drop' to convert it")
    if weight.numel() == head_dim:  # Qwen3: per head
        return weight.repeat(num_heads)
    if weight.numel() == num_heads * head_dim:  # OLMo-3: over the whole projection
        return weight.reshape(-1)
    raise HybridlabError(
        f"{type(attn).__name__}.{norm_name} has {weight.numel()} channels, expected {head_dim} or "
        f"{num_heads * head_dim}; use qk_norm='drop'"
    )


def _repeat_heads(t: torch.Tensor, num_kv_heads: int, n_rep: int) -> torch.Tensor:
    """[KV*D, ...] -> [KV*n_rep*D, ...], each KV head repeated for its group of query heads."""
    return t.reshape(num_kv_heads, -1, *t.shape[1:]).repeat_interleave(n_rep, dim=0).reshape(-1, *t.shape[1:])


def _copy_linear(dst: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None, what: str) -> None:
    if dst.weight.shape != weight.shape or (bias is None) != (dst.bias is None):
        raise HybridlabError(
            f"mixer {what} is {tuple(dst.weight.shape)} (bias={dst.bias is not None}) but the teacher gives "
            f"{tuple(weight.shape)} (bias={bias is not None}); the mixer must keep the teacher's heads and head_dim"
        )
    dst.weight.copy_(weight)
    if bias is not None:
        dst.bias.copy_(bias)


@torch.no_grad()
def inherit_attention(mixer: nn.Module, attn: nn.Module, config, qk_norm: str) -> None:
    """Copy q/o and head-repeated k/v projections (and folded q/k-norm gains) from `attn` into `mixer`."""
    num_heads, num_kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    n_rep = num_heads // num_kv
    gains = {"q": None, "k": None}
    if qk_norm == "fold":
        gains = {"q": _norm_gain(attn, "q_norm", num_heads, head_dim), "k": _norm_gain(attn, "k_norm", num_kv, head_dim)}
    for name, gain in gains.items():
        proj = getattr(attn, f"{name}_proj")
        weight, bias = proj.weight, proj.bias
        if gain is not None:
            weight = weight * gain[:, None].to(weight.dtype)
            bias = None if bias is None else bias * gain.to(bias.dtype)
        if name == "k":
            weight = _repeat_heads(weight, num_kv, n_rep)
            bias = None if bias is None else _repeat_heads(bias, num_kv, n_rep)
        _copy_linear(getattr(mixer, f"{name}_proj"), weight, bias, f"{name}_proj")
    v_bias = attn.v_proj.bias
    _copy_linear(
        mixer.v_proj,
        _repeat_heads(attn.v_proj.weight, num_kv, n_rep),
        None if v_bias is None else _repeat_heads(v_bias, num_kv, n_rep),
        "v_proj",
    )
    _copy_linear(mixer.o_proj, attn.o_proj.weight, attn.o_proj.bias, "o_proj")


def convert_to_hybrid(
    model,
    fa_layers: list[int],
    mixer_kind: str,
    *,
    mixer_overrides: dict | None = None,
    seed: int = 0,
    qk_norm: str = "fold",
    conv_init: str | None = None,
    inplace: bool = False,
):
    """A hybrid of `model` with full attention kept at `fa_layers` and `mixer_kind` mixers elsewhere.

    The teacher is left untouched unless `inplace`. Returns the (copied) transformers model with
    ``hybridlab_spec`` set; its mixers inherit q/k/v/o as described in the module docstring.
    `inplace` turns `model` itself into the hybrid without a copy: each replaced attention is inherited
    from and dropped before the next mixer is built, so the peak stays near the student's own size (a
    conversion job that loads the teacher only to convert it holds no second copy).
    `conv_init` ("random" | "identity"; None = MixerConfig's default "random") initialises the q/k/v
    short convolutions; it is the same as ``mixer_overrides={"conv_init": ...}``.
    """
    from hybridlab.models.placements import fa_layers as resolve_fa_layers

    if qk_norm not in QK_NORM_MODES:
        raise HybridlabError(f"qk_norm must be one of {QK_NORM_MODES}, got {qk_norm!r}")
    if hasattr(model, "hybridlab_spec"):
        raise HybridlabError("model is already a hybrid; convert the dense teacher instead")
    _, teacher_layers = _decoder_layers(model)
    fa = resolve_fa_layers("explicit", len(teacher_layers), indices=fa_layers)
    if conv_init is not None:
        given = (mixer_overrides or {}).get("conv_init", conv_init)
        if given != conv_init:
            raise HybridlabError(f"conv_init={conv_init!r} but mixer_overrides has conv_init={given!r}; give it once")
        mixer_overrides = {**(mixer_overrides or {}), "conv_init": conv_init}
    mixer_cfg = teacher_mixer_config(model, mixer_kind, mixer_overrides)
    config = model.config.get_text_config(decoder=True)
    if config.num_attention_heads % config.num_key_value_heads:
        raise HybridlabError(
            f"num_attention_heads {config.num_attention_heads} is not a multiple of num_key_value_heads "
            f"{config.num_key_value_heads}; cannot repeat KV heads"
        )
    student = model if inplace else copy.deepcopy(model)
    _, layers = _decoder_layers(student)
    spec = HybridSpec(
        fa_layers=fa,
        mixer_kind=mixer_kind,
        mixer_config=dataclasses.asdict(mixer_cfg),
        num_layers=len(layers),
        qk_norm=qk_norm,
        seed=seed,
        base_model=getattr(model.config, "_name_or_path", None) or None,
    )
    apply_hybrid_structure(student, spec,
                           on_swap=lambda wrapper, attn: inherit_attention(wrapper.mixer, attn, config, qk_norm))
    return student
