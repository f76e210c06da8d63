"""Recurrent token mixers (Gated DeltaNet, KDA, GLA) as ``nn.Module``s with fla-compatible parameter names.

Each mixer maps ``x [B, T, hidden]`` to ``y [B, T, hidden]`` like an attention block and has the
attention projections ``q_proj (hidden -> H*K)``, ``k_proj (hidden -> H*K)``, ``v_proj (hidden -> H*V)``
and ``o_proj (H*V -> hidden)``, so a converter can copy a pre-trained attention layer into it. The rest
follows flash-linear-attention 0.6's layers (``fla/layers/gated_deltanet.py``, ``kda.py``, ``gla.py``)
in names, shapes, formulas and initialisation, so state dicts are interchangeable with fla:

- all kinds: ``q_conv1d / k_conv1d / v_conv1d`` depthwise causal short convolutions with SiLU
  (weight ``[D, 1, conv_size]``, no bias) when ``use_short_conv``; without them GDN and KDA apply SiLU
  to q, k, v (as fla does) and GLA uses the raw projections.
  ``conv_init``: ``"random"`` (default) keeps ``nn.Conv1d``'s (fla's) random kernel; ``"identity"``
  sets every channel's kernel to (0, ..., 0, 1), so with causal left padding conv(x)_t = x_t exactly
  (SiLU still follows). The random kernel is drawn either way, so the option changes no other
  parameter's initialisation; parameter names and shapes are the same.
- **gdn**: ``a_proj`` / ``b_proj`` (hidden -> H), ``A_log`` and ``dt_bias`` ``[H]``; decay
  ``g = -exp(A_log) * softplus(a_proj(x) + dt_bias)``, ``beta = sigmoid(b_proj(x))``, q/k L2-normalised;
  output ``o_norm`` = RMSNorm gated by ``swish(g_proj(x))``.
- **kda**: low-rank ``f_proj`` (hidden -> V -> H*K), ``b_proj``, ``A_log [H]``, ``dt_bias [H*K]``;
  per-channel decay ``g = -exp(A_log_h) * softplus(f_proj(x) + dt_bias)``; output ``o_norm`` gated by
  ``sigmoid(g_proj(x))`` with low-rank ``g_proj`` (hidden -> V -> H*V, bias on the second layer).
- **gla**: low-rank ``gk_proj`` (hidden -> 16 -> H*K, bias on the second layer); decay
  ``g = logsigmoid(gk_proj(x)) / 16``; output ``g_norm_swish_gate`` gated by ``swish(g_proj(x))``.
- ``output_gate`` (default True, fla's layout above): with False the output norm (``o_norm`` /
  ``g_norm_swish_gate``, same name, same ``weight``) is the plain per-head RMSNorm of the recurrence
  output, ``o / rms(o) * weight``, and the module has no ``g_proj``. ``g_proj`` is each kind's last
  randomly initialised parameter, so leaving it out changes no other parameter's initialisation.

Padding (``attention_mask_BT``, 1 = real token, 0 = padding, left or right): padded positions get
zero conv inputs, ``k = v = 0``, log-decay 0 (decay 1) and ``beta = 0``, so they change neither the
real positions nor the state; their outputs are zero. The returned conv state holds the last
``conv_size - 1`` *real* inputs of each row, so decoding can continue after right padding too.

Documents (``document_ids_BT``, an integer id per position, equal within one document and changing
at each document start, as transformers' packed-sequence detection derives from ``position_ids``):
nothing crosses a document boundary. The short convolutions see zeros before a document's first
token, and the recurrence restarts from a zero state at it: the ``[B, T]`` batch is flattened to one
row split at fla's ``cu_seqlens`` (fla's varlen kernels on CUDA; padded per-document rows on CPU,
see ``ops.common.varlen_cpu``). Each document's outputs therefore equal those of the document run
alone. Not combinable with a decoding state.

Decoding: pass the :class:`MixerState` of the previous call; the module continues from it for any
``T >= 1`` (token-by-token recurrence for short inputs without autograd, the chunked op otherwise).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybridlab.errors import HybridlabError
from hybridlab.models import ops

MIXER_KINDS = ("gdn", "kda", "gla")
CONV_INITS = ("random", "identity")
RECURRENT_MAX_LEN = 16  # without autograd, inputs up to this length use the token-by-token op (as fla does)
GLA_GATE_LOW_RANK = 16
GLA_GATE_LOGIT_NORMALIZER = 16


@dataclass
class MixerConfig:
    kind: str  # "gdn" | "kda" | "gla"
    hidden_size: int
    num_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_size: int = 4
    use_short_conv: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    norm_eps: float = 1e-6
    chunk_size: int = 64
    conv_init: str = "random"  # "random" | "identity" (see the module docstring)
    output_gate: bool = True  # False: the output norm is an ungated RMSNorm and there is no g_proj

    def __post_init__(self) -> None:
        if self.kind not in MIXER_KINDS:
            raise HybridlabError(f"mixer kind {self.kind!r} is unknown; use one of {', '.join(MIXER_KINDS)}")
        for name in ("hidden_size", "num_heads", "head_k_dim", "head_v_dim", "conv_size", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise HybridlabError(f"MixerConfig.{name} must be a positive int, got {value!r}")
        if not self.norm_eps > 0:
            raise HybridlabError(f"MixerConfig.norm_eps must be > 0, got {self.norm_eps!r}")
        if self.conv_init not in CONV_INITS:
            raise HybridlabError(f"MixerConfig.conv_init={self.conv_init!r} is unknown; use one of {CONV_INITS}")
        for name in ("use_short_conv", "output_gate"):
            if not isinstance(getattr(self, name), bool):
                raise HybridlabError(f"MixerConfig.{name} must be true or false, got {getattr(self, name)!r}")


@dataclass
class MixerState:
    """Recurrent state for step-by-step decoding."""

    conv_states: tuple[Tensor | None, ...]  # last (conv_size-1) inputs of the q/k/v short convs, [B, W-1, D]
    recurrent_BHKV: Tensor


class ShortConvolution(nn.Conv1d):
    """Depthwise causal convolution + SiLU over ``[B, T, D]`` (fla's ``ShortConvolution`` weights)."""

    def __init__(self, hidden_size: int, kernel_size: int):
        super().__init__(hidden_size, hidden_size, kernel_size, groups=hidden_size, bias=False)

    @torch.no_grad()
    def init_identity(self) -> None:
        """Kernel (0, ..., 0, 1) per channel: the convolution (before SiLU) returns its input."""
        self.weight.zero_()
        self.weight[..., -1] = 1.0

    def forward(self, x_BTD: Tensor, cache_BWD: Tensor | None, mask_BT: Tensor | None,
                docs_BT: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        B, T, D = x_BTD.shape
        W = self.kernel_size[0]
        if mask_BT is not None:
            x_BTD = x_BTD * mask_BT[..., None]
        if docs_BT is not None:
            return F.silu(self._within_documents(x_BTD, docs_BT)), None  # no decoding state across documents
        if cache_BWD is None:
            cache_BWD = x_BTD.new_zeros(B, W - 1, D)
        xin_BLD = torch.cat([cache_BWD.to(x_BTD.dtype), x_BTD], dim=1)
        y_BTD = F.conv1d(xin_BLD.transpose(1, 2), self.weight, self.bias, groups=D).transpose(1, 2)
        return F.silu(y_BTD), _last_real_window(xin_BLD, mask_BT, W - 1)


    def _within_documents(self, x_BTD: Tensor, docs_BT: Tensor) -> Tensor:
        """The causal convolution with every tap that reaches into an earlier document zeroed."""
        W = self.kernel_size[0]
        y_BTD = x_BTD * self.weight[:, 0, W - 1]
        for lag in range(1, min(W, x_BTD.shape[1])):
            same_BT = docs_BT[:, lag:] == docs_BT[:, :-lag]  # position t and t - lag in one document
            tap = x_BTD[:, :-lag] * (same_BT[..., None] * self.weight[:, 0, W - 1 - lag])
            y_BTD = y_BTD + F.pad(tap, (0, 0, lag, 0))
        return y_BTD


def _last_real_window(xin_BLD: Tensor, mask_BT: Tensor | None, width: int) -> Tensor:
    """The ``width`` conv inputs ending at each row's last real token (``xin`` = cache ++ inputs)."""
    if mask_BT is None or width == 0:
        return xin_BLD[:, xin_BLD.shape[1] - width:]
    T = mask_BT.shape[1]
    positions = torch.arange(T, device=mask_BT.device).expand_as(mask_BT)
    # rows without real tokens keep the old cache, i.e. the window ending just before the inputs
    last_B = torch.where(mask_BT > 0, positions, -1).amax(dim=1) + width
    idx_BW = last_B[:, None] + torch.arange(1 - width, 1, device=mask_BT.device)
    return torch.gather(xin_BLD, 1, idx_BW[..., None].expand(-1, -1, xin_BLD.shape[-1]))


def _varlen(cu_seqlens: Tensor | None) -> dict:
    """The op keyword for the variable-length form (only the chunked ops take it)."""
    return {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}


def _f32(x: Tensor) -> Tensor:
    """Upcast half precision to fp32 for gates and norms; fp32 / fp64 stay as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class GatedRMSNorm(nn.Module):
    """``RMSNorm(x) * weight * act(gate)`` per head (fla's ``FusedRMSNormGated``), computed in >= fp32.

    ``gate=None`` (a mixer with ``output_gate=False``): the plain ``RMSNorm(x) * weight``."""

    def __init__(self, hidden_size: int, eps: float, activation: str):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.activation = activation

    def forward(self, x: Tensor, gate: Tensor | None) -> Tensor:
        x32 = _f32(x)
        y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps) * _f32(self.weight)
        if gate is not None:
            gate32 = _f32(gate)
            y = y * (F.silu(gate32) if self.activation == "swish" else torch.sigmoid(gate32))
        return y.to(x.dtype)


def _inverse_softplus_dt(n: int) -> Tensor:
    """fla's ``dt_bias`` init: dt log-uniform in [1e-3, 1e-1] (floored at 1e-4), stored as softplus^-1(dt)."""
    dt = torch.exp(torch.rand(n) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))


class RecurrentMixer(nn.Module, ABC):
    """Shared projections, short convs, masking, state handling; subclasses add gates and the op."""

    silu_without_conv = True  # fla's GDN / KDA apply SiLU to q, k, v when short convs are off

    def __init__(self, cfg: MixerConfig, layer_idx: int):
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        H, K, V = cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim
        self.key_dim, self.value_dim = H * K, H * V
        self.q_proj = nn.Linear(cfg.hidden_size, self.key_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.key_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.value_dim, bias=cfg.qkv_bias)
        if cfg.use_short_conv:
            self.q_conv1d = ShortConvolution(self.key_dim, cfg.conv_size)
            self.k_conv1d = ShortConvolution(self.key_dim, cfg.conv_size)
            self.v_conv1d = ShortConvolution(self.value_dim, cfg.conv_size)
            if cfg.conv_init == "identity":  # after the random draw: the RNG stream is the same
                for conv in (self.q_conv1d, self.k_conv1d, self.v_conv1d):
                    conv.init_identity()
        self.o_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=cfg.o_bias)

    @abstractmethod
    def gates(self, x_BTD: Tensor) -> tuple[Tensor, Tensor | None]:
        """Log-decay ``g`` (``[B, T, H]`` or ``[B, T, H, K]``) and ``beta [B, T, H]`` (None for GLA)."""

    @abstractmethod
    def mix(self, q, k, v, g, beta, initial_state, recurrent: bool, cu_seqlens=None) -> tuple[Tensor, Tensor]:
        """Run the recurrent op (token-by-token if ``recurrent``); returns ``o [B, T, H, V]`` and the final state.

        ``cu_seqlens`` (with ``B = 1`` inputs) selects the chunked op's variable-length form."""

    def output_norm(self, o_BTHV: Tensor, x_BTD: Tensor) -> Tensor:
        """The RMSNorm of the op output, ``[B, T, H, V]``, gated by ``g_proj(x)`` unless ``output_gate`` is off."""
        gate = None if self.g_proj is None else self.g_proj(x_BTD).view(o_BTHV.shape)
        return self.norm_module()(o_BTHV, gate)

    @abstractmethod
    def norm_module(self) -> GatedRMSNorm:
        """The output norm (``o_norm`` / ``g_norm_swish_gate``)."""

    def _check(self, x_BTD: Tensor, mask_BT: Tensor | None, state: MixerState | None) -> None:
        if x_BTD.dim() != 3 or x_BTD.shape[-1] != self.cfg.hidden_size:
            raise HybridlabError(
                f"{self.cfg.kind} mixer (layer {self.layer_idx}) expects x of shape [B, T, {self.cfg.hidden_size}], "
                f"got {tuple(x_BTD.shape)}"
            )
        if mask_BT is not None and tuple(mask_BT.shape) != tuple(x_BTD.shape[:2]):
            raise HybridlabError(
                f"attention_mask_BT must be [B, T] = {tuple(x_BTD.shape[:2])} (1 = token, 0 = padding), "
                f"got {tuple(mask_BT.shape)}"
            )
        if state is not None:
            expected = (x_BTD.shape[0], self.cfg.num_heads, self.cfg.head_k_dim, self.cfg.head_v_dim)
            if tuple(state.recurrent_BHKV.shape) != expected:
                raise HybridlabError(
                    f"MixerState.recurrent_BHKV must be {expected} for this input and layer, got "
                    f"{tuple(state.recurrent_BHKV.shape)}; pass the state returned for the same batch"
                )

    def forward(
        self,
        x_BTD: Tensor,
        attention_mask_BT: Tensor | None = None,
        state: MixerState | None = None,
        use_cache: bool = False,
        document_ids_BT: Tensor | None = None,
    ) -> tuple[Tensor, MixerState | None]:
        self._check(x_BTD, attention_mask_BT, state)
        docs = document_ids_BT
        if docs is not None and (state is not None or use_cache):
            raise HybridlabError(f"{self.cfg.kind} mixer (layer {self.layer_idx}): document_ids_BT cannot be combined "
                                 "with a decoding state or use_cache; run packed documents with use_cache=False")
        if docs is not None and tuple(docs.shape) != tuple(x_BTD.shape[:2]):
            raise HybridlabError(f"document_ids_BT must be [B, T] = {tuple(x_BTD.shape[:2])}, got {tuple(docs.shape)}")
        B, T, _ = x_BTD.shape
        H, K, V = self.cfg.num_heads, self.cfg.head_k_dim, self.cfg.head_v_dim
        mask_BT = None if attention_mask_BT is None else attention_mask_BT.to(x_BTD.dtype)
        q, k, v = self.q_proj(x_BTD), self.k_proj(x_BTD), self.v_proj(x_BTD)
        conv_states: tuple[Tensor | None, ...] = (None, None, None)
        if self.cfg.use_short_conv:
            old = state.conv_states if state is not None else (None, None, None)
            q, cq = self.q_conv1d(q, old[0], mask_BT, docs)
            k, ck = self.k_conv1d(k, old[1], mask_BT, docs)
            v, cv = self.v_conv1d(v, old[2], mask_BT, docs)
            conv_states = (cq, ck, cv)
        elif self.silu_without_conv:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        g, beta = self.gates(x_BTD)
        if mask_BT is not None:
            k, v = k * mask_BT[..., None], v * mask_BT[..., None]
            g = g * (mask_BT[..., None] if g.dim() == 3 else mask_BT[..., None, None])
            beta = None if beta is None else beta * mask_BT[..., None]
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
        if docs is not None:
            o_BTHV, final_BHKV = self._mix_documents(q, k, v, g, beta, docs)
        else:
            recurrent = T <= RECURRENT_MAX_LEN and not torch.is_grad_enabled()
            initial = None if state is None else state.recurrent_BHKV
            o_BTHV, final_BHKV = self.mix(q, k, v, g, beta, initial, recurrent)
        o_BTHV = o_BTHV.to(q.dtype)  # the CPU ops accumulate in fp32; fla returns the inputs' dtype, so do we
        y_BTD = self.o_proj(self.output_norm(o_BTHV, x_BTD).reshape(B, T, self.value_dim))
        if mask_BT is not None:
            y_BTD = y_BTD * mask_BT[..., None]
        new_state = MixerState(conv_states, final_BHKV) if use_cache else None
        return y_BTD, new_state


    def _mix_documents(self, q, k, v, g, beta, docs_BT):
        """The chunked op over ``[1, B*T]`` split at every row start and document start (fla's cu_seqlens)."""
        B, T = docs_BT.shape
        starts_BT = torch.ones_like(docs_BT, dtype=torch.bool)
        starts_BT[:, 1:] = docs_BT[:, 1:] != docs_BT[:, :-1]
        total = torch.tensor([B * T], device=docs_BT.device)
        cu = torch.cat([starts_BT.reshape(-1).nonzero().reshape(-1), total])
        flat = [None if x is None else x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v, g, beta)]
        o, _ = self.mix(*flat, None, False, cu_seqlens=cu)
        return o.reshape(B, T, *o.shape[2:]), None


class GatedDeltaNetMixer(RecurrentMixer):
    """Gated DeltaNet (Yang et al. 2024) mixer, parameters as fla's ``GatedDeltaNet`` (use_gate=True)."""

    def __init__(self, cfg: MixerConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        H = cfg.num_heads
        self.a_proj = nn.Linear(cfg.hidden_size, H, bias=False)
        self.b_proj = nn.Linear(cfg.hidden_size, H, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(0, 16)))
        self.A_log._no_weight_decay = True
        self.dt_bias = nn.Parameter(_inverse_softplus_dt(H))
        self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Linear(cfg.hidden_size, self.value_dim, bias=False) if cfg.output_gate else None
        self.o_norm = GatedRMSNorm(cfg.head_v_dim, cfg.norm_eps, "swish")

    def gates(self, x_BTD):
        g = -_f32(self.A_log).exp() * F.softplus(_f32(self.a_proj(x_BTD)) + _f32(self.dt_bias))
        return g, torch.sigmoid(_f32(self.b_proj(x_BTD)))

    def mix(self, q, k, v, g, beta, initial_state, recurrent, cu_seqlens=None):
        op = ops.fused_recurrent_gated_delta_rule if recurrent else ops.chunk_gated_delta_rule
        return op(q, k, v, g, beta, initial_state=initial_state, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, chunk_size=self.cfg.chunk_size, **_varlen(cu_seqlens))

    def norm_module(self):
        return self.o_norm


class KimiDeltaAttentionMixer(RecurrentMixer):
    """Kimi Delta Attention mixer, parameters as fla's ``KimiDeltaAttention``."""

    def __init__(self, cfg: MixerConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        H, K, V = cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim
        self.f_proj = nn.Sequential(
            nn.Linear(cfg.hidden_size, V, bias=False), nn.Linear(V, self.key_dim, bias=False)
        )
        self.b_proj = nn.Linear(cfg.hidden_size, H, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
        self.A_log._no_weight_decay = True
        self.dt_bias = nn.Parameter(_inverse_softplus_dt(H * K))
        self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Sequential(
            nn.Linear(cfg.hidden_size, V, bias=False), nn.Linear(V, self.value_dim, bias=True)
        ) if cfg.output_gate else None
        self.o_norm = GatedRMSNorm(V, cfg.norm_eps, "sigmoid")

    def gates(self, x_BTD):
        B, T, _ = x_BTD.shape
        H, K = self.cfg.num_heads, self.cfg.head_k_dim
        pre = _f32(self.f_proj(x_BTD)).view(B, T, H, K) + _f32(self.dt_bias).view(H, K)
        g = -_f32(self.A_log).exp()[:, None] * F.softplus(pre)
        return g, torch.sigmoid(_f32(self.b_proj(x_BTD)))

    def mix(self, q, k, v, g, beta, initial_state, recurrent, cu_seqlens=None):
        op = ops.fused_recurrent_kda if recurrent else ops.chunk_kda
        return op(q, k, v, g, beta, initial_state=initial_state, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, chunk_size=self.cfg.chunk_size, **_varlen(cu_seqlens))

    def norm_module(self):
        return self.o_norm


class GatedLinearAttentionMixer(RecurrentMixer):
    """Gated Linear Attention mixer, parameters as fla's ``GatedLinearAttention`` (fused swish-gated norm)."""

    silu_without_conv = False  # fla's GLA feeds the raw projections when short convs are off

    def __init__(self, cfg: MixerConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.gk_proj = nn.Sequential(
            nn.Linear(cfg.hidden_size, GLA_GATE_LOW_RANK, bias=False),
            nn.Linear(GLA_GATE_LOW_RANK, self.key_dim, bias=True),
        )
        self.g_proj = nn.Linear(cfg.hidden_size, self.value_dim, bias=False) if cfg.output_gate else None
        self.g_norm_swish_gate = GatedRMSNorm(cfg.head_v_dim, cfg.norm_eps, "swish")

    def gates(self, x_BTD):
        B, T, _ = x_BTD.shape
        logits = _f32(self.gk_proj(x_BTD)).view(B, T, self.cfg.num_heads, self.cfg.head_k_dim)
        return F.logsigmoid(logits) / GLA_GATE_LOGIT_NORMALIZER, None

    def mix(self, q, k, v, g, beta, initial_state, recurrent, cu_seqlens=None):
        op = ops.fused_recurrent_gla if recurrent else ops.chunk_gla
        return op(q, k, v, g, initial_state=initial_state, output_final_state=True,
                  chunk_size=self.cfg.chunk_size, **_varlen(cu_seqlens))

    def norm_module(self):
        return self.g_norm_swish_gate


_MIXERS: dict[str, type[RecurrentMixer]] = {
    "gdn": GatedDeltaNetMixer,
    "kda": KimiDeltaAttentionMixer,
    "gla": GatedLinearAttentionMixer,
}


def build_mixer(cfg: MixerConfig, layer_idx: int) -> nn.Module:
    """The mixer of ``cfg.kind`` with fresh (fla-style) initialisation."""
    return _MIXERS[cfg.kind](cfg, layer_idx)
