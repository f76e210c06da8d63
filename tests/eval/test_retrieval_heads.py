"""DuoAttention-style retrieval heads: the gated attention op, passkey data, and a hand-built retrieval head."""

import numpy as np
import pytest
import torch

from hybridlab.errors import HybridlabError
from hybridlab.eval import retrieval_heads as rh

# ---- the op -------------------------------------------------------------------------------------------------


def _naive(q, k, v, visible_TS, scaling):
    """Reference softmax attention over an explicit visibility matrix, per head, [B, T, H, D]."""
    B, H, T, D = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = torch.zeros(B, T, H, D, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                keys = [j for j in range(k.shape[2]) if visible_TS[t, j]]
                s = torch.stack([q[b, h, t] @ k[b, h, j] for j in keys]) * scaling
                w = torch.softmax(s, 0)
                out[b, t, h] = sum(wi * v[b, h, j] for wi, j in zip(w, keys))
    return out


def test_streaming_mask_by_hand():
    m = rh.streaming_mask(6, 6, sink=1, recent=2)
    expected = torch.tensor([[1, 0, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0],
                             [1, 0, 1, 1, 0, 0],
                             [1, 0, 0, 1, 1, 0],
                             [1, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)
    # decoding: 2 new queries at positions 4 and 5 of 6 keys
    assert torch.equal(rh.streaming_mask(2, 6, sink=1, recent=2), expected[4:])


def test_duo_attention_matches_naive_mix():
    torch.manual_seed(0)
    B, H, G, T, D = 2, 4, 2, 7, 3
    q, k, v = torch.randn(B, H, T, D, dtype=torch.float64), torch.randn(B, G, T, D, dtype=torch.float64), \
        torch.randn(B, G, T, D, dtype=torch.float64)
    full = _naive(q, k, v, rh.causal_mask(T, T), 0.5)
    stream = _naive(q, k, v, rh.streaming_mask(T, T, 1, 2), 0.5)
    alpha = torch.tensor([0.25, 1.0], dtype=torch.float64)
    got = rh.duo_attention(q, k, v, alpha, scaling=0.5, sink=1, recent=2)
    a_H = torch.tensor([0.25, 0.25, 1.0, 1.0], dtype=torch.float64)[None, None, :, None]
    assert torch.allclose(got, a_H * full + (1 - a_H) * stream, atol=1e-12)
    assert torch.allclose(rh.duo_attention(q, k, v, torch.zeros(2, dtype=torch.float64), scaling=0.5, sink=1,
                                           recent=2), stream, atol=1e-12)
    # the streaming branch really differs from full attention here (the test could fail)
    assert (full - stream).abs().max() > 1e-3


def _tiny_llama(**over):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    cfg = dict(vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
               head_dim=16, intermediate_size=8, no_rope_layers=[0], tie_word_embeddings=False,
               pad_token_id=15, bos_token_id=15, eos_token_id=15, rms_norm_eps=1e-6)
    cfg.update(over)
    return SmolLM3ForCausalLM(SmolLM3Config(**cfg)).eval()


def test_gates_at_one_leave_the_model_unchanged_and_remove_restores():
    torch.manual_seed(1)
    model = _tiny_llama(num_hidden_layers=2, no_rope_layers=[0, 0])
    ids = torch.randint(0, 15, (2, 12))
    ref = model(input_ids=ids).logits
    gates = rh.install_gates(model, sink=1, recent=3)
    assert gates.heads() == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert torch.allclose(model(input_ids=ids).logits, ref, atol=1e-5)
    with gates.pinned(torch.zeros(4)):
        assert (model(input_ids=ids).logits - ref).abs().max() > 1e-3
    gates.remove()
    assert model.config._attn_implementation != rh.DUO_IMPL
    assert not hasattr(model.model.layers[0].self_attn, "duo_gate")
    assert torch.allclose(model(input_ids=ids).logits, ref, atol=1e-5)


# ---- a hand-built model with one retrieval head --------------------------------------------------------------
DIGITS, FILLERS, QUERY = range(10), (10, 11, 12), 13


def _retrieval_model():
    """One NoPE attention layer over one-hot embeddings (dims 0..15 = token, dim 31 = 1 for every token).

    Head 0 (retrieval): the QUERY token's query matches any digit's key (score 36 vs 0), its value copies
    the digit into dims 16..25, and the LM head reads digit d from dim 16 + d. Head 1 attends uniformly
    and its value is the constant dim, written to dim 30 (read by nothing): its output is the same under
    full and streaming attention. Without the digit in view, the filler token 10 wins (it reads dim 31).
    """
    model = _tiny_llama()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        emb = model.model.embed_tokens.weight
        emb[:16, :16] = torch.eye(16)
        emb[:, 31] = 1.0
        for norm in (model.model.layers[0].input_layernorm, model.model.layers[0].post_attention_layernorm,
                     model.model.norm):
            norm.weight.fill_(1.0)
        attn = model.model.layers[0].self_attn
        attn.q_proj.weight[0, QUERY] = 3.0
        attn.k_proj.weight[0, list(DIGITS)] = 3.0
        attn.v_proj.weight[list(DIGITS), list(DIGITS)] = 1.0
        attn.o_proj.weight[[16 + d for d in DIGITS], list(DIGITS)] = 1.0
        attn.v_proj.weight[16, 31] = 1.0
        attn.o_proj.weight[30, 16] = 1.0
        model.lm_head.weight[list(DIGITS), [16 + d for d in DIGITS]] = 1.0
        model.lm_head.weight[FILLERS[0], 31] = 0.5
    return model


def _digit_examples(n, T, sink, recent, seed):
    rng = np.random.default_rng(seed)
    ids = torch.tensor(rng.choice(FILLERS, size=(n, T)))
    labels = torch.full((n, T), rh.IGNORE)
    for i in range(n):
        d = int(rng.integers(1, 10))
        pos = int(rng.integers(sink, T - 2 - recent))  # outside the recent window of the query at T - 2
        ids[i, pos] = d
        ids[i, T - 2] = QUERY
        ids[i, T - 1] = d
        labels[i, T - 1] = d
    return {"input_ids": ids, "labels": labels}


def test_hand_built_retrieval_head_gets_the_highest_gate_and_masking_it_kills_accuracy(tmp_path):
    model = _retrieval_model()
    sink, recent = 2, 6
    train = _digit_examples(16, 32, sink, recent, seed=0)
    test = _digit_examples(16, 32, sink, recent, seed=1)
    assert rh.passkey_accuracy(model, test)["accuracy"] == 1.0  # the construction retrieves

    cfg = rh.DuoConfig(sink=sink, recent=recent, steps=30, micro_batch_size=8, lr=0.05, l1=0.05)
    alphas, curve = rh.analyse_retrieval_heads(model, train, test, cfg, model_name="hand", out_dir=str(tmp_path))
    a = {row["kv_head"]: row["alpha"] for row in alphas.iter_rows(named=True)}
    assert a[0] > 0.9 and a[1] < 0.3, a  # retrieval head kept, the position-blind head pushed to streaming
    assert curve["n_masked"].to_list() == [0, 1, 2]
    assert curve["masked_kv_head"].to_list() == [None, 1, 0]  # lowest alpha masked first
    assert curve["accuracy"].to_list() == [1.0, 1.0, 0.0]
    assert curve["answer_nll"][2] > curve["answer_nll"][1] + 1.0
    # gates are gone afterwards: the model is back to plain attention and all weights were frozen
    assert model.config._attn_implementation != rh.DUO_IMPL
    assert rh.passkey_accuracy(model, test)["accuracy"] == 1.0


# ---- passkey data ---------------------------------------------------------------------------------------------


class _CharTokenizer:
    """One token per character (ids = ord % 200): enough to check lengths and positions."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 200 for c in text]}


def test_passkey_examples_have_fixed_length_answer_labels_and_a_far_needle():
    tok = _CharTokenizer()
    hay = np.arange(300, 300 + 5000)
    ex = rh.make_passkey_examples(tok, hay, n=5, context_len=200, n_digits=5, sink=4, recent=16, seed=3)
    assert ex["input_ids"].shape == (5, 200) and ex["labels"].shape == (5, 200)
    for i in range(5):
        lab = ex["labels"][i]
        ans = lab[lab != rh.IGNORE]
        assert len(ans) == 6  # " " + 5 digits, at the very end
        assert torch.equal(ex["input_ids"][i, -6:], ans)
        key = "".join(chr(int(t)) for t in ans[1:])
        needle = [ord(c) % 200 for c in rh.NEEDLE.format(key=key)]
        pos = int(ex["needle_pos"][i])
        assert ex["input_ids"][i, pos:pos + len(needle)].tolist() == needle
        first_pred = 200 - 6 - 1
        assert 4 <= pos and pos + len(needle) - 1 <= first_pred - 16  # outside sink and the recent window
    # seeded
    again = rh.make_passkey_examples(tok, hay, n=5, context_len=200, n_digits=5, sink=4, recent=16, seed=3)
    assert torch.equal(again["input_ids"], ex["input_ids"])
    with pytest.raises(HybridlabError, match="raise context_len"):
        rh.make_passkey_examples(tok, hay, n=1, context_len=100, n_digits=5, sink=4, recent=40, seed=0)
