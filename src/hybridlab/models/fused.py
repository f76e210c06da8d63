"""A fused RMSNorm for CPU training: one autograd node instead of the eager chain of transformers' RMSNorm.

transformers' decoder RMSNorm (Qwen3, SmolLM3, Llama, ...) is an eager chain of element-wise ops,

    y = w * (x * rsqrt(mean(x^2, -1) + eps)),

and autograd keeps every intermediate and runs one backward kernel per op. On a CPU those passes over the
activations cost as much as the model's small GEMMs (docs/performance.md: the teacher update is ~27 %
element-wise work). `_RMSNormFunction` computes the same forward with the same ops in the same order (so
its output is bit-identical) and a hand-written backward in five passes instead of about ten:

    x^ = x r,  r = (mean(x^2) + eps)^-1/2,  g = dy * w,
    dx = r g - x^ (r mean(g * x^)),          dw = sum over tokens of dy * x^.

Gradients equal autograd's up to float rounding order (tested against it and against fp64 gradcheck).

`fuse_rms_norms(model)` swaps the class of every RMSNorm module whose forward is exactly the chain above
(`FUSABLE`, checked by name: other RMSNorms, such as Gemma's 1 + w, are left alone) for a subclass whose
forward takes the fused path only where it applies (fp32 input and weight, a gradient wanted) and calls the
original otherwise. Parameter names, the state dict and `save_pretrained` are unchanged; the returned
function restores the original classes. The training engine applies it on CPU (`train.fsdp.Engine`);
`HYBRIDLAB_FUSED_RMSNORM=0` in the environment turns it off (for side-by-side benchmarks).
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch import nn

# transformers classes whose forward is: x.float(); x * rsqrt(x.pow(2).mean(-1) + eps); weight * x.to(dtype)
FUSABLE = frozenset({"Qwen3RMSNorm", "Qwen2RMSNorm", "SmolLM3RMSNorm", "LlamaRMSNorm", "MistralRMSNorm"})


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        xhat = x * rstd
        ctx.save_for_backward(xhat, weight, rstd)
        return weight * xhat

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        xhat, weight, rstd = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy * xhat).reshape(-1, weight.numel()).sum(0)
        if ctx.needs_input_grad[0]:
            g = dy * weight
            coef = (g * xhat).mean(-1, keepdim=True).mul_(rstd)
            dx = torch.addcmul(g.mul_(rstd), xhat, coef, value=-1.0)
        return dx, dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x * rsqrt(mean(x^2, -1) + eps) with the fused backward (fp32 `x` and `weight`)."""
    return _RMSNormFunction.apply(x, weight, eps)


class _Fused:
    """Mixin put in front of a FUSABLE class: the fused path where it applies, the original forward elsewhere."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if (hidden_states.dtype == torch.float32 and self.weight.dtype == torch.float32 and torch.is_grad_enabled()
                and (hidden_states.requires_grad or self.weight.requires_grad)):
            return rms_norm(hidden_states, self.weight, self.variance_epsilon)
        return super().forward(hidden_states)


_FUSED_CLASSES: dict[type, type] = {}


def _fused_class(cls: type) -> type:
    if cls not in _FUSED_CLASSES:
        _FUSED_CLASSES[cls] = type(f"Fused{cls.__name__}", (_Fused, cls), {"__module__": __name__})
    return _FUSED_CLASSES[cls]


def fuse_rms_norms(model: nn.Module) -> Callable[[], None]:
    """Give every FUSABLE RMSNorm of `model` the fused forward; returns the function that undoes it."""
    if os.environ.get("HYBRIDLAB_FUSED_RMSNORM", "1") == "0":
        return lambda: None
    swapped = []
    for module in model.modules():
        cls = type(module)
        if cls.__name__ in FUSABLE and not isinstance(module, _Fused):
            module.__class__ = _fused_class(cls)
            swapped.append((module, cls))

    def restore() -> None:
        for module, cls in swapped:
            module.__class__ = cls
        swapped.clear()

    return restore
