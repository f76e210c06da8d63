"""One CUDA/CPU dispatch for the public ops: :func:`fla_dispatch`.

Each public op (``chunk_gated_delta_rule``, ``fused_recurrent_kda``, ...) is written as its CPU
implementation on fla's signature and decorated once with the fla kernel it stands for::

    @fla_dispatch("fla.ops.gla", "fused_recurrent_gla", per_channel_g=True, allow_gva=False,
                  fla_names={"g": "gk"})
    def fused_recurrent_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                            chunk_size=64):
        ...  # the CPU implementation, for one batch of equal-length rows

A call then

1. validates the inputs once with :func:`~hybridlab.models.ops.common.check_inputs` (shapes of q, k,
   v, g, beta and initial_state, ``chunk_size``, ``cu_seqlens``), under the op's name;
2. sends CUDA tensors (``q.is_cuda``) to fla's kernel, imported lazily, on CUDA calls only, through
   the op module's ``fla_op`` (a missing fla or Triton raises its one-line
   :class:`~hybridlab.errors.HybridlabError`). Every argument is passed by keyword (fla's positional
   order differs, e.g. ``fused_recurrent_gated_delta_rule(q, k, v, g, gk, gv, beta, ...)``), under
   fla's name (``fla_names``: ``g`` is ``gk`` for fla's ``fused_recurrent_gla``), with ``scale=None``
   left to fla's ``K ** -0.5`` default; ``chunk_size`` is passed only when it is one of
   ``fla_chunk_sizes`` (fla's accepted tiles; otherwise fla's default tile, which does not change the
   result), and ``cu_seqlens`` only when given, as int64 on q's device;
3. runs the decorated function on CPU tensors; with ``cu_seqlens`` (fla's variable-length form) it
   runs once on the sequences gathered into padded rows by
   :func:`~hybridlab.models.ops.common.varlen_cpu` (the decorated function then sees
   ``cu_seqlens=None``, one initial state per row, and never needs its own variable-length code).

Triton is never called for CPU tensors, and fla is never imported at module import time.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from hybridlab.models.ops.common import check_inputs, fla_op, varlen_cpu

# the per-token tensors of an op, in signature order: the ones varlen_cpu splits into rows
SEQUENCE_ARGS = ("q", "k", "v", "g", "beta")


def uses_fla(q: Tensor) -> bool:
    """Whether a call goes to fla's Triton kernel: exactly when the inputs are CUDA tensors."""
    return q.is_cuda


def fla_kwargs(arguments: Mapping[str, object], q: Tensor, fla_chunk_sizes: tuple[int, ...],
               fla_names: Mapping[str, str]) -> dict[str, object]:
    """The keyword arguments of fla's kernel for the bound arguments of a public op (see the module doc)."""
    kwargs = {}
    for name, value in arguments.items():
        if name == "chunk_size":
            if value in fla_chunk_sizes:
                kwargs[name] = value
        elif name == "cu_seqlens":
            if value is not None:
                kwargs[name] = value.to(q.device, torch.long)
        else:
            kwargs[fla_names.get(name, name)] = value
    return kwargs


def fla_dispatch(
    fla_module: str,
    fla_name: str,
    *,
    per_channel_g: bool,
    allow_gva: bool = True,
    fla_chunk_sizes: tuple[int, ...] = (),
    fla_names: Mapping[str, str] | None = None,
) -> Callable[[Callable], Callable]:
    """Decorate an op's CPU implementation into the public op that also dispatches to fla's ``fla_module.fla_name``.

    ``per_channel_g``: g is ``[B, T, HV, K]`` (GLA, KDA) rather than ``[B, T, HV]`` (GDN); ``allow_gva``:
    v may have a multiple of q's heads (grouped value attention); ``fla_chunk_sizes``: the ``chunk_size``
    values forwarded to fla; ``fla_names``: argument renames for fla. The decorated function keeps its
    name, signature and docstring; its arguments must be named as in fla (``q, k, v, g[, beta], scale,
    initial_state, output_final_state, ..., chunk_size[, cu_seqlens]``).
    """
    renames = dict(fla_names or {})

    def decorate(cpu_impl: Callable) -> Callable:
        op = cpu_impl.__name__
        signature = inspect.signature(cpu_impl)
        seq_names = [name for name in SEQUENCE_ARGS if name in signature.parameters]
        module_globals = cpu_impl.__globals__  # the op module's fla_op, looked up per call (tests replace it)

        @functools.wraps(cpu_impl)
        def public_op(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)  # a bad call raises Python's usual TypeError
            bound.apply_defaults()
            a = bound.arguments
            q, cu_seqlens = a["q"], a.get("cu_seqlens")
            check_inputs(op, q, a["k"], a["v"], a["g"], a.get("beta"), a["initial_state"], per_channel_g,
                         a.get("chunk_size"), allow_gva=allow_gva, cu_seqlens=cu_seqlens)
            if uses_fla(q):
                kernel = module_globals.get("fla_op", fla_op)(fla_module, fla_name)
                return kernel(**fla_kwargs(a, q, fla_chunk_sizes, renames))
            if cu_seqlens is None:
                return cpu_impl(**a)

            def rows(*padded):
                *seqs, h0, final = padded
                return cpu_impl(**{**a, **dict(zip(seq_names, seqs)), "initial_state": h0,
                                   "output_final_state": final, "cu_seqlens": None})

            return varlen_cpu(rows, cu_seqlens, [a[name] for name in seq_names], a["initial_state"],
                              a["output_final_state"])

        public_op.fla_kernel = (fla_module, fla_name)
        return public_op

    return decorate
