"""Layer Retrieval Ability Score: hand-built models whose retrieving layers are known, a naive reference
on a real hybrid, undefined scores and input errors."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from hybridlab.data import spaced_retrieval as sr
from hybridlab.errors import HybridlabError
from hybridlab.eval.retrieval_score import retrieval_scores
from hybridlab.train import spaced_retrieval as srt

D = 32  # channels: 0-12 token one-hot, 13-22 retrieved digit, 23-31 scratch
RET = 13
SCRATCH = 23


class Retriever(nn.Module):
    """At every position from the second `$` on, reads the digit one-hot of the residual stream at the
    matching stored position (p - d2 + 1) and writes `weight` x it into the retrieved-digit channels."""

    def __init__(self, weight: float | list[float]):
        super().__init__()
        self.weight = weight  # one number, or one per answer index k = p - d2
        self.ids = None

    def forward(self, h_BTD):
        out = torch.zeros_like(h_BTD)
        for b in range(h_BTD.shape[0]):
            d2 = int(torch.nonzero(self.ids[b] == sr.DOLLAR_ID)[1])
            for p in range(d2, h_BTD.shape[1]):
                w = self.weight if isinstance(self.weight, float) else self.weight[min(p - d2, len(self.weight) - 1)]
                out[b, p, RET:RET + 10] = w * h_BTD[b, p - d2 + 1, :10]
        return out, None


class Distractor(nn.Module):
    """Input-dependent output (differs between A and B everywhere) that no later reader uses."""

    def forward(self, h_BTD):
        out = torch.zeros_like(h_BTD)
        out[..., SCRATCH:] = 3.0 * h_BTD[..., :D - SCRATCH] + 1.0
        return (out,)


class Layer(nn.Module):
    def __init__(self, mixer):
        super().__init__()
        self.self_attn = mixer

    def forward(self, h_BTD):
        return h_BTD + self.self_attn(h_BTD)[0]


class HandBuilt(nn.Module):
    """Embedding = token one-hot; logits of digit v = retrieved channel v (others -10)."""

    def __init__(self, mixers, kinds):
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=len(mixers), layer_types=kinds)
        self.layers = nn.ModuleList(Layer(m) for m in mixers)
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the model a device

    def forward(self, input_ids, attention_mask=None):
        for layer in self.layers:
            if isinstance(layer.self_attn, Retriever):
                layer.self_attn.ids = input_ids
        h = torch.nn.functional.one_hot(input_ids, D).float()
        for layer in self.layers:
            h = layer(h)
        logits = torch.full((*input_ids.shape, sr.VOCAB_SIZE), -10.0)
        logits[..., :10] = h[..., RET:RET + 10]
        return SimpleNamespace(logits=logits)


def pairs(n=12, gaps=(3, 9), t=4):
    cfg = sr.SpacedRetrievalConfig(t=t, gaps=gaps, gap_weights=(0.5,) * len(gaps), n_train=0, n_val=0, n_test=n)
    return sr.make_ab_pairs(sr.generate_split(cfg, "test"), seed=5)


def test_hand_built_single_retriever_scores_one_and_distractors_zero():
    model = HandBuilt([Distractor(), Retriever(5.0), Distractor()], ["kda", "full_attention", "kda"])
    a, b = pairs()
    rows = retrieval_scores(model, a, b, batch_size=5)
    assert rows.height == 2 * 3 and set(rows["gap"]) == {3, 9}
    for r in rows.iter_rows(named=True):
        assert r["n"] == 6
        assert r["margin_clean"] == pytest.approx(5.0) and r["margin_b"] == pytest.approx(-5.0)
        if r["layer"] == 1:
            assert r["layer_type"] == "full_attention"
            assert r["score"] == pytest.approx(1.0) and r["margin_patched"] == pytest.approx(-5.0)
        else:
            assert r["layer_type"] == "kda"
            assert r["score"] == pytest.approx(0.0, abs=1e-12)


def test_hand_built_split_retrieval_scores_halves():
    """Two layers each carrying half the retrieved signal score 0.5 each."""
    model = HandBuilt([Retriever(2.5), Distractor(), Retriever(2.5)], ["kda", "full_attention", "full_attention"])
    a, b = pairs(gaps=(5,))
    rows = retrieval_scores(model, a, b, batch_size=4).sort("layer")
    assert rows["score"].to_list() == pytest.approx([0.5, 0.0, 0.5])
    assert rows["layer_type"].to_list() == ["kda", "full_attention", "full_attention"]


def test_score_is_a_ratio_of_sums_over_items():
    """Per answer index k, layer 0 carries weight 1 and layer 1 weight k: score = sum / sum
    (0.4 and 0.6 for t=4), not the mean of per-item ratios (0.52 for layer 0)."""
    model = HandBuilt([Retriever([1.0] * 4), Retriever([0.0, 1.0, 2.0, 3.0])], ["kda", "full_attention"])
    a, b = pairs(gaps=(3, 6), t=4)
    rows = retrieval_scores(model, a, b).sort(["gap", "layer"])
    assert rows["score"].to_list() == pytest.approx([0.4, 0.6, 0.4, 0.6])
    assert rows["margin_clean"].to_list() == pytest.approx([2.5] * 4)  # mean over k of 1 + k


def test_undefined_score_when_model_ignores_the_digits():
    model = HandBuilt([Distractor(), Retriever(0.0)], ["kda", "full_attention"])
    a, b = pairs(gaps=(4,))
    rows = retrieval_scores(model, a, b)
    assert all(math.isnan(s) for s in rows["score"].to_list())
    assert rows["margin_clean"].to_list() == [0.0, 0.0]


class _Patched(nn.Module):
    """Reference patching: wraps a module and overwrites its output at given positions with stored rows."""

    def __init__(self, inner, pos_K, rows_KD):
        super().__init__()
        self.inner, self.pos_K, self.rows_KD = inner, pos_K, rows_KD

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        y = out[0].clone()
        y[0, self.pos_K] = self.rows_KD
        return (y, *out[1:])


def _reference_scores(model, a, b):
    """Naive: one example at a time, module swapped in place of self_attn, per-item margins summed."""
    layers = model.model.layers
    out = {}
    for g in sorted(set(a.gaps_N.tolist())):
        idx = np.flatnonzero(a.gaps_N == g)
        num = {l: 0.0 for l in range(len(layers))}
        den = 0.0
        for i in idx:
            ea, eb = sr.build_example(a.digits_NK[i], g), sr.build_example(b.digits_NK[i], g)
            pos, da, db = ea["answer_pos"], ea["answer_digits"], eb["answer_digits"]

            def margin(logits):
                lk = logits[0, pos].double()
                return lk[torch.arange(len(pos)), da] - lk[torch.arange(len(pos)), db]

            stored = {}
            hooks = [layers[l].self_attn.register_forward_hook(
                lambda m, i_, o, l=l: stored.__setitem__(l, o[0][0, pos].clone())) for l in range(len(layers))]
            m_b = margin(model(input_ids=eb["input_ids"][None]).logits)
            for h in hooks:
                h.remove()
            m_clean = margin(model(input_ids=ea["input_ids"][None]).logits)
            den += float((m_clean - m_b).sum())
            for l in range(len(layers)):
                orig = layers[l].self_attn
                layers[l].self_attn = _Patched(orig, pos, stored[l])
                try:
                    m_p = margin(model(input_ids=ea["input_ids"][None]).logits)
                finally:
                    layers[l].self_attn = orig
                num[l] += float((m_clean - m_p).sum())
        out[g] = {l: (num[l] / den if den / (len(idx) * len(pos)) >= 1e-9 else math.nan) for l in num}
    return out


def test_matches_naive_reference_on_a_real_hybrid():
    cfg = srt.SRModelConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            intermediate_size=32, mixer_overrides={"chunk_size": 8})
    model = srt.build_sr_model(cfg, seed=0).double().eval()  # fp64: batched vs one-by-one agree to ~1e-12
    # sharpen the random model so margins are not tiny (its scores are meaningless but well defined)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    a, b = pairs(n=6, gaps=(2, 7), t=3)
    with torch.no_grad():
        ref = _reference_scores(model, a, b)
    model.train()  # retrieval_scores evaluates in eval mode and restores the caller's mode
    rows = retrieval_scores(model, a, b, batch_size=2, min_denominator=1e-9)
    assert model.training
    assert rows["layer_type"].to_list()[:4] == ["kda", "full_attention", "kda", "full_attention"]
    assert rows.height == 8 and rows["score"].is_not_nan().sum() >= 4  # not a comparison of NaNs only
    for r in rows.iter_rows(named=True):
        assert r["score"] == pytest.approx(ref[r["gap"]][r["layer"]], rel=1e-6, abs=1e-9, nan_ok=True)
    assert all(not layer.self_attn._forward_hooks for layer in model.model.layers)  # hooks removed


def test_input_errors():
    model = HandBuilt([Retriever(1.0)], ["full_attention"])
    a, b = pairs(gaps=(3,))
    with pytest.raises(HybridlabError, match="aligned pairs"):
        retrieval_scores(model, a, sr.RetrievalRecords(b.digits_NK[:-1], b.gaps_N[:-1]))
    with pytest.raises(HybridlabError, match="coincide"):
        retrieval_scores(model, a, a)
    with pytest.raises(HybridlabError, match="out of range"):
        retrieval_scores(model, a, b, layers=[3])
