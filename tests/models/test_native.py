"""transformers' own hybrids on CPU with fla installed: the unpatched route hits fla, the patched one runs.

Tiny random models from local configs (no hub). GDN models are compared with transformers' own
torch reference implementation, selected by temporarily binding the module globals to it.
"""

import contextlib
import sys
import types

import pytest
import torch
from transformers import (
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    OlmoHybridConfig,
    OlmoHybridForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

from hybridlab.errors import HybridlabError
from hybridlab.models import native
from hybridlab.models.native import enable_cpu_fallback, kernel_closure, original_kernel_function, patch_model_for_device

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
GDN_LAYERS = ["linear_attention", "linear_attention", "full_attention"]
GDN_DIMS = dict(linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)


def _qwen3_5():
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**COMMON, **GDN_DIMS, head_dim=8, layer_types=GDN_LAYERS))


def _olmo_hybrid():
    return OlmoHybridForCausalLM(OlmoHybridConfig(**COMMON, **GDN_DIMS, pad_token_id=0, eos_token_id=1, layer_types=GDN_LAYERS))


def _qwen3_next():
    cfg = Qwen3NextConfig(
        **COMMON, **GDN_DIMS, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, layer_types=GDN_LAYERS,
    )
    return Qwen3NextForCausalLM(cfg)


def _granite_hybrid():
    cfg = GraniteMoeHybridConfig(
        **COMMON, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32, mamba_n_heads=4,
        mamba_d_state=8, mamba_d_head=16, mamba_chunk_size=16, layer_types=["mamba", "mamba", "attention"],
    )
    return GraniteMoeHybridForCausalLM(cfg)


BUILDERS = {"qwen3_5": _qwen3_5, "olmo_hybrid": _olmo_hybrid, "qwen3_next": _qwen3_next, "granitemoehybrid": _granite_hybrid}
GDN_MODELS = ("qwen3_5", "olmo_hybrid", "qwen3_next")


def _build(name, attn="eager"):
    torch.manual_seed(0)
    model = BUILDERS[name]()
    model.config._attn_implementation = attn
    return model.eval()


@contextlib.contextmanager
def transformers_torch_reference(module):
    """Temporarily bind every kernel-fallback global of `module` to transformers' own torch implementation."""
    saved = {}
    for name in list(vars(module)):
        closure = kernel_closure(original_kernel_function(module, name))
        if closure is not None:
            saved[name] = getattr(module, name)
            setattr(module, name, closure["torch_function"])
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)


def test_unpatched_gdn_routes_to_fla_and_fails_on_cpu():
    import transformers.models.qwen3_5.modeling_qwen3_5 as mod

    original = original_kernel_function(mod, "torch_chunk_gated_delta_rule")
    closure = kernel_closure(original)
    assert closure["implementation"].__module__.startswith("fla.")
    assert closure["is_new_implementation"] is True
    q = torch.randn(1, 8, 2, 8)
    v = torch.randn(1, 8, 2, 8)
    g = -torch.rand(1, 8, 2)
    beta = torch.rand(1, 8, 2)
    with pytest.raises(Exception):  # Triton: no active GPU driver for CPU tensors
        original(q, q.clone(), v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    enable_cpu_fallback()
    out, _ = mod.torch_chunk_gated_delta_rule(q, q.clone(), v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    with transformers_torch_reference(mod):
        ref, _ = mod.torch_chunk_gated_delta_rule(q, q.clone(), v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_enable_is_idempotent_and_covers_known_modules():
    first = enable_cpu_fallback()
    bound = {m: {n: getattr(sys.modules[m], n) for n in names} for m, names in first.items()}
    assert enable_cpu_fallback() == first
    assert all(getattr(sys.modules[m], n) is fn for m, fns in bound.items() for n, fn in fns.items())
    assert "torch_chunk_gated_delta_rule" in first["transformers.models.qwen3_5.modeling_qwen3_5"]
    assert "mamba2_chunk_scan" in first["transformers.models.granitemoehybrid.modeling_granitemoehybrid"]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_native_hybrid_forward_on_cpu(name):
    model = _build(name)
    patched = patch_model_for_device(model)
    assert type(model).__module__ in patched
    ids = torch.randint(2, 96, (2, 20))
    out = model(ids, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 3 + 1
    assert all(h.shape == (2, 20, 32) for h in out.hidden_states)
    assert len(out.attentions) == 1  # one full-attention layer
    assert out.attentions[0].shape == (2, 4, 20, 20)
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(2, 4, 20))
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize("name", GDN_MODELS)
def test_gdn_models_match_transformers_torch_fallback(name):
    model = _build(name, attn="sdpa")
    patch_model_for_device(model)
    ids = torch.randint(2, 96, (2, 70))  # > one 64-token chunk
    out = model(ids).logits
    with transformers_torch_reference(sys.modules[type(model).__module__]):
        ref = model(ids).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert not torch.equal(out, model(ids.flip(-1)).logits)  # the comparison is not vacuous


def test_cached_decode_of_patched_qwen3_5_matches_full_forward():
    model = _build("qwen3_5", attn="sdpa")
    patch_model_for_device(model)
    ids = torch.randint(2, 96, (1, 6))
    gen = model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    seq = ids
    for _ in range(4):
        nxt = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(gen, seq)


def test_dispatch_routes_by_device():
    calls = []

    def reference_op(x):
        calls.append("torch")
        return x + 1

    fake = types.ModuleType("fake_modeling")
    fake.reference_op = use_kernel_func_from_hub_with_fallback("causal_conv1d_fn", "causal_conv1d")(reference_op)
    original = fake.reference_op
    assert native.patch_module(fake) == ["reference_op"]
    assert native.patch_module(fake) == ["reference_op"]  # idempotent
    assert fake.reference_op is not original and original_kernel_function(fake, "reference_op") is original
    assert fake.reference_op(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert calls == ["torch"]
    sentinel = object()
    cuda_like = native._make_dispatch(lambda *a, **k: sentinel, kernel_closure(original))
    real_probe = native._first_tensor_device
    native._first_tensor_device = lambda args, kwargs: torch.device("cuda")
    try:
        assert cuda_like(torch.zeros(1)) is sentinel
    finally:
        native._first_tensor_device = real_probe


def test_patch_module_refuses_known_module_without_kernels():
    empty = types.ModuleType("transformers.models.fake.modeling_fake")
    with pytest.raises(HybridlabError, match="needs updating"):
        native.patch_module(empty, required=True)


@pytest.mark.parametrize("name", ["qwen3_5", "olmo_hybrid"])
def test_native_hybrid_runs_in_bf16_on_cpu(name):
    """The CPU op returns the inputs' dtype, as fla does (an fp32 output met the bf16 out_proj and failed)."""
    if name not in BUILDERS:
        pytest.skip(f"{name} is not built here")
    model = _build(name).to(torch.bfloat16)
    patch_model_for_device(model)
    ids = torch.randint(2, 96, (1, 12))
    with torch.no_grad():
        logits = model(ids).logits
        out = model.generate(ids, max_new_tokens=3, do_sample=False)  # prefill + cached decode steps (NIAH)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    assert out.shape == (1, 15)
