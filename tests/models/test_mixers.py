"""Recurrent mixer modules: fla-compatible weights, decode == parallel, padding, reference composition."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from hybridlab.errors import HybridlabError
from hybridlab.models import ops
from hybridlab.models.mixers import MixerConfig, MixerState, build_mixer

with warnings.catch_warnings():  # fla warns that Triton cannot run on this CPU-only machine
    warnings.simplefilter("ignore")
    from fla.layers.gated_deltanet import GatedDeltaNet
    from fla.layers.gla import GatedLinearAttention
    from fla.layers.kda import KimiDeltaAttention
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.gla.naive import naive_recurrent_gla
    from fla.ops.kda.gate import naive_kda_gate
    from fla.ops.kda.naive import naive_recurrent_kda

KINDS = ("gdn", "kda", "gla")
HIDDEN, HEADS, K, V = 32, 2, 8, 12


def make_mixer(kind, dtype=torch.float64, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = MixerConfig(kind=kind, hidden_size=HIDDEN, num_heads=HEADS, head_k_dim=K, head_v_dim=V, chunk_size=8, **kw)
    return build_mixer(cfg, layer_idx=3).to(dtype)


def fla_layer(kind):
    if kind == "gdn":
        return GatedDeltaNet(hidden_size=HIDDEN, head_dim=K, num_heads=HEADS, expand_v=V / K)
    if kind == "kda":
        return KimiDeltaAttention(hidden_size=HIDDEN, head_dim=K, num_heads=HEADS, expand_v=V / K)
    return GatedLinearAttention(
        hidden_size=HIDDEN, expand_k=HEADS * K / HIDDEN, expand_v=HEADS * V / HIDDEN, num_heads=HEADS,
        use_short_conv=True,
    )


def inputs(B=2, T=21, dtype=torch.float64, seed=1):
    return torch.randn(B, T, HIDDEN, dtype=dtype, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_is_interchangeable_with_fla(kind):
    ours, theirs = make_mixer(kind, dtype=torch.float32), fla_layer(kind)
    ours_shapes = {name: tuple(t.shape) for name, t in ours.state_dict().items()}
    fla_shapes = {name: tuple(t.shape) for name, t in theirs.state_dict().items()}
    assert ours_shapes == fla_shapes
    ours.load_state_dict(theirs.state_dict(), strict=True)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):  # what a converter copies from attention
        assert isinstance(getattr(ours, name), torch.nn.Linear)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_decay_init_follows_fla(kind):
    m = make_mixer(kind, dtype=torch.float32)
    A = m.A_log.exp()
    assert ((A >= (0 if kind == "gdn" else 1)) & (A <= 16)).all()
    dt = F.softplus(m.dt_bias)
    assert ((dt >= 1e-4 - 1e-7) & (dt <= 0.1 + 1e-6)).all()
    assert m.dt_bias.shape == ((HEADS,) if kind == "gdn" else (HEADS * K,))


def _causal_conv_silu(x, weight):
    """Independent depthwise causal conv: y_t = sum_i w_i x_{t - W + 1 + i}."""
    W = weight.shape[-1]
    xp = F.pad(x, (0, 0, W - 1, 0))
    y = sum(weight[:, 0, i] * xp[:, i:i + x.shape[1]] for i in range(W))
    return F.silu(y)


@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_composition_of_fla_references(kind):
    m = make_mixer(kind, dtype=torch.float32)
    x = inputs(dtype=torch.float32)
    B, T, _ = x.shape
    with torch.no_grad():
        q = _causal_conv_silu(m.q_proj(x), m.q_conv1d.weight).view(B, T, HEADS, K)
        k = _causal_conv_silu(m.k_proj(x), m.k_conv1d.weight).view(B, T, HEADS, K)
        v = _causal_conv_silu(m.v_proj(x), m.v_conv1d.weight).view(B, T, HEADS, V)
        if kind == "gdn":
            g = naive_gdn_gate(m.a_proj(x), m.A_log, m.dt_bias)
            o, _ = naive_recurrent_gated_delta_rule(
                F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, torch.sigmoid(m.b_proj(x)), g
            )
            gate, norm, act = m.g_proj(x), m.o_norm, F.silu
        elif kind == "kda":
            g = naive_kda_gate(m.f_proj(x).view(B, T, HEADS, K), m.A_log, m.dt_bias)
            o, _ = naive_recurrent_kda(
                F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, g, torch.sigmoid(m.b_proj(x))
            )
            gate, norm, act = m.g_proj(x), m.o_norm, torch.sigmoid
        else:
            g = F.logsigmoid(m.gk_proj(x).view(B, T, HEADS, K)) / 16
            o, _ = naive_recurrent_gla(q, k, v, g)
            gate, norm, act = m.g_proj(x), m.g_norm_swish_gate, F.silu
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + norm.eps) * norm.weight
        o = o * act(gate.view(B, T, HEADS, V))
        expected = m.o_proj(o.reshape(B, T, HEADS * V))
        got, state = m(x)
    assert state is None
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("use_short_conv", [True, False])
def test_token_by_token_decoding_equals_parallel_forward(kind, use_short_conv):
    m = make_mixer(kind, use_short_conv=use_short_conv)
    x = inputs()
    y, final = m(x, use_cache=True)
    with torch.no_grad():
        state, steps = None, []
        for t in range(x.shape[1]):
            y_t, state = m(x[:, t:t + 1], state=state, use_cache=True)
            steps.append(y_t)
    torch.testing.assert_close(torch.cat(steps, 1), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.recurrent_BHKV, final.recurrent_BHKV, rtol=1e-10, atol=1e-10)
    if use_short_conv:
        assert all(c.shape == (2, 3, d) for c, d in zip(state.conv_states, (HEADS * K, HEADS * K, HEADS * V)))
    else:
        assert state.conv_states == (None, None, None)


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_then_continue_equals_one_call(kind):
    m = make_mixer(kind)
    x = inputs(T=40)
    y, _ = m(x)
    y1, state = m(x[:, :23], use_cache=True)  # 23 and 17 tokens: both take the chunked path
    y2, _ = m(x[:, 23:], state=state)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_left_padded_batch_equals_unpadded_sequences(kind):
    m = make_mixer(kind)
    lengths, T = (9, 14), 14
    seqs = [inputs(B=1, T=n, seed=10 + i) for i, n in enumerate(lengths)]
    x = torch.zeros(2, T, HIDDEN, dtype=torch.float64)
    mask = torch.zeros(2, T)
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        x[i, T - n:] = s[0]
        x[i, :T - n] = 7.0  # garbage in the padding must not leak
        mask[i, T - n:] = 1
    y, state = m(x, attention_mask_BT=mask, use_cache=True)
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        y_ref, state_ref = m(s, use_cache=True)
        torch.testing.assert_close(y[i, T - n:], y_ref[0], rtol=1e-10, atol=1e-10)
        assert (y[i, :T - n] == 0).all()
        torch.testing.assert_close(state.recurrent_BHKV[i], state_ref.recurrent_BHKV[0], rtol=1e-10, atol=1e-10)
        for c, c_ref in zip(state.conv_states, state_ref.conv_states):
            torch.testing.assert_close(c[i], c_ref[0])


@pytest.mark.parametrize("kind", KINDS)
def test_right_padded_prompt_then_decode(kind):
    m = make_mixer(kind)
    x = inputs(B=1, T=12)
    y_full, _ = m(x)
    padded = torch.cat([x[:, :8], torch.full((1, 5, HIDDEN), 3.0, dtype=x.dtype)], 1)
    mask = torch.tensor([[1.0] * 8 + [0.0] * 5])
    y_prompt, state = m(padded, attention_mask_BT=mask, use_cache=True)
    with torch.no_grad():
        y_next, _ = m(x[:, 8:], state=state)
    torch.testing.assert_close(y_prompt[:, :8], y_full[:, :8], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y_next, y_full[:, 8:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_path_agrees_with_naive_op(kind, monkeypatch):
    m = make_mixer(kind)
    x = inputs(T=30)
    y_chunk, _ = m(x)  # autograd enabled -> chunked op
    naive = {"gdn": ops.naive_recurrent_gdn, "kda": ops.naive_recurrent_kda, "gla": ops.naive_recurrent_gla}[kind]
    name = {"gdn": "chunk_gated_delta_rule", "kda": "chunk_kda", "gla": "chunk_gla"}[kind]
    monkeypatch.setattr(ops, name, lambda *a, chunk_size, **kw: naive(*a, **kw))
    y_naive, _ = m(x)
    torch.testing.assert_close(y_chunk, y_naive, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_every_parameter(kind):
    m = make_mixer(kind, dtype=torch.float32).train()
    x = inputs(T=19, dtype=torch.float32).requires_grad_()
    mask = torch.ones(2, 19)
    mask[1, :4] = 0
    y, _ = m(x, attention_mask_BT=mask)
    y.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert (x.grad[1, :4] == 0).all()  # padded inputs influence nothing


def test_bf16_module_runs_and_keeps_dtype():
    m = make_mixer("gdn", dtype=torch.bfloat16)
    y, state = m(inputs(T=10, dtype=torch.bfloat16), use_cache=True)
    assert y.dtype == torch.bfloat16 and state.recurrent_BHKV.dtype == torch.float32


def test_config_and_input_errors():
    with pytest.raises(HybridlabError, match="mixer kind"):
        MixerConfig(kind="mamba", hidden_size=8, num_heads=1, head_k_dim=8, head_v_dim=8)
    with pytest.raises(HybridlabError, match="num_heads"):
        MixerConfig(kind="gdn", hidden_size=8, num_heads=0, head_k_dim=8, head_v_dim=8)
    m = make_mixer("gdn")
    with pytest.raises(HybridlabError, match="expects x"):
        m(torch.randn(2, 5, HIDDEN + 1, dtype=torch.float64))
    with pytest.raises(HybridlabError, match="attention_mask_BT"):
        m(inputs(T=5), attention_mask_BT=torch.ones(2, 4))
    bad = MixerState((None, None, None), torch.zeros(3, HEADS, K, V, dtype=torch.float64))
    with pytest.raises(HybridlabError, match="recurrent_BHKV"):
        m(inputs(T=5), state=bad)


def test_hybrid_forward_in_bf16_returns_bf16():
    """The CPU mixer ops accumulate in fp32; the mixer hands o_proj the inputs' dtype (bf16 analyses)."""
    import torch
    from tiny_models import tiny_qwen3

    from hybridlab.models.convert import convert_to_hybrid

    torch.manual_seed(0)
    for kind in ("gdn", "kda", "gla"):
        model = convert_to_hybrid(tiny_qwen3(max_position_embeddings=32), [1], kind).to(torch.bfloat16).eval()
        with torch.no_grad():
            logits = model(input_ids=torch.randint(0, 64, (1, 10))).logits
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all(), kind
