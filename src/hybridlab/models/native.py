"""Run transformers' own hybrid models (Qwen3.5, OLMo-Hybrid, Qwen3-Next, Granite-4.0-H) on CPU with fla installed.

How transformers 5.x picks a kernel: each modelling module defines its recurrent ops as torch functions
decorated with ``integrations.hub_kernels.use_kernel_func_from_hub_with_fallback(func_name, package)``
(e.g. ``torch_chunk_gated_delta_rule`` <- ``("chunk_gated_delta_rule", "fla")``, ``causal_conv1d_fn``
<- ``"causal_conv1d"``, the Mamba-2 scans <- ``"mamba_ssm"``). At IMPORT time the decorator tries
``import <package>``; if that works, the module-level name is bound to a wrapper that always calls the
package's function (fla's Triton kernels), whatever the tensors' device. The layers' ``forward`` call
these module globals, so with fla installed a CPU forward of Qwen3.5 / OLMo-Hybrid / Qwen3-Next dies
inside Triton ("0 active drivers"). Granite-4.0-H only reaches ``mamba_ssm`` / ``causal_conv1d``, which
fail the same way on CPU when installed.

The fix (``enable_cpu_fallback`` / ``patch_model_for_device``): rebind each such module global to a
dispatcher that looks at the call's tensors. CUDA tensors go to the original wrapper (so fla and the
other kernels still run on GPU); any other device goes to

- :mod:`hybridlab.models.ops` for the gated delta rule (``chunk_gated_delta_rule``,
  ``fused_recurrent_gated_delta_rule``), after repeating q/k heads for grouped value attention as the
  transformers reference does;
- transformers' own undecorated torch reference (the wrapper's ``__wrapped__``) for everything else.

A kernel-fallback wrapper is recognised by its closure (``implementation``, ``torch_function``,
``func_name``); if a known hybrid module has none, transformers changed how it picks kernels and we
raise instead of silently doing nothing. Patching is idempotent and process-wide (module globals).
"""

from __future__ import annotations

import functools
import importlib
import sys
from types import ModuleType

import torch

from hybridlab.errors import HybridlabError

KNOWN_HYBRID_MODULES: tuple[str, ...] = (
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "transformers.models.olmo_hybrid.modeling_olmo_hybrid",
    "transformers.models.qwen3_next.modeling_qwen3_next",
    "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
)
_FALLBACK_FREEVARS = {"implementation", "torch_function", "func_name"}
_PATCHED_ATTR = "_hybridlab_cpu_dispatch_of"


def kernel_closure(fn) -> dict | None:
    """The closure of a transformers kernel-fallback wrapper as a dict, or None if `fn` is not one."""
    code = getattr(fn, "__code__", None)
    if code is None or fn.__closure__ is None or not _FALLBACK_FREEVARS <= set(code.co_freevars):
        return None
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, fn.__closure__)}


def _first_tensor_device(args, kwargs) -> torch.device | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _gdn_cpu(op_name: str):
    """CPU gated delta rule through hybridlab.models.ops, accepting transformers' call convention."""

    def run(
        query,
        key,
        value,
        g,
        beta,
        chunk_size: int = 64,
        initial_state=None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        cu_seqlens=None,
        **_unused,
    ):
        from hybridlab.models import ops

        if cu_seqlens is not None:
            raise HybridlabError(
                "packed sequences (cu_seqlens) are not supported by the CPU gated-delta-rule path; pad the batch instead"
            )
        # Grouped value attention: each q/k head serves num_v_heads // num_k_heads consecutive value heads.
        num_k_heads, num_v_heads = key.shape[2], value.shape[2]
        if num_v_heads != num_k_heads:
            query = query.repeat_interleave(num_v_heads // num_k_heads, dim=2)
            key = key.repeat_interleave(num_v_heads // num_k_heads, dim=2)
        kwargs = dict(
            initial_state=initial_state,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        if op_name == "chunk_gated_delta_rule":
            kwargs["chunk_size"] = chunk_size
        out, state = getattr(ops, op_name)(query, key, value, g, beta, **kwargs)
        # fla's kernels return the inputs' dtype (the model's next projection expects it); the CPU ops accumulate in fp32
        return out.to(value.dtype), (state if output_final_state else None)

    return run


_HYBRIDLAB_CPU_OPS = {
    "chunk_gated_delta_rule": _gdn_cpu("chunk_gated_delta_rule"),
    "fused_recurrent_gated_delta_rule": _gdn_cpu("fused_recurrent_gated_delta_rule"),
}


def _make_dispatch(original, closure: dict):
    cpu_impl = _HYBRIDLAB_CPU_OPS.get(closure["func_name"], closure["torch_function"])

    @functools.wraps(closure["torch_function"])
    def dispatch(*args, **kwargs):
        device = _first_tensor_device(args, kwargs)
        if device is not None and device.type == "cuda":
            return original(*args, **kwargs)
        return cpu_impl(*args, **kwargs)

    setattr(dispatch, _PATCHED_ATTR, original)
    dispatch.cpu_impl = cpu_impl
    return dispatch


def patch_module(module: ModuleType, *, required: bool = False) -> list[str]:
    """Rebind every kernel-fallback function of `module` to a device dispatcher; returns the names now dispatched."""
    patched = []
    for name, obj in list(vars(module).items()):
        if getattr(obj, _PATCHED_ATTR, None) is not None:
            patched.append(name)  # already dispatching (idempotent)
            continue
        closure = kernel_closure(obj)
        if closure is None:
            continue
        setattr(module, name, _make_dispatch(obj, closure))
        patched.append(name)
    if required and not patched:
        import transformers

        raise HybridlabError(
            f"{module.__name__} has no kernel-fallback functions in transformers {transformers.__version__}; "
            "hybridlab.models.native needs updating for this transformers version"
        )
    return sorted(patched)


def enable_cpu_fallback() -> dict[str, list[str]]:
    """Patch every known transformers hybrid module present in this install; returns {module: dispatched names}."""
    result = {}
    for module_name in KNOWN_HYBRID_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue  # this transformers has no such model
        result[module_name] = patch_module(module, required=True)
    return result


def patch_model_for_device(model: torch.nn.Module) -> dict[str, list[str]]:
    """Patch the transformers modelling modules that `model`'s submodules come from; returns what was dispatched."""
    result = {}
    for module_name in sorted({type(m).__module__ for m in model.modules()}):
        if not module_name.startswith("transformers.models."):
            continue
        names = patch_module(sys.modules[module_name], required=module_name in KNOWN_HYBRID_MODULES)
        if names:
            result[module_name] = names
    return result


def original_kernel_function(module: ModuleType, name: str):
    """The transformers wrapper that `name` was bound to before patching (itself if unpatched)."""
    obj = getattr(module, name)
    return getattr(obj, _PATCHED_ATTR, obj)
