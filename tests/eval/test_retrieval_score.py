"""Layer Retrieval Ability Score: hand-built models whose retrieving layers are known, a local copier
that retrieves nothing (the artefact of patching every answer position), a naive reference on a real
hybrid, undefined scores and input errors."""

import math
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
from torch import nn

from hybridlab.data import spaced_retrieval as sr
from hybridlab.errors import HybridlabError
from hybridlab.eval.retrieval_score import retrieval_scores
from hybridlab.train import spaced_retrieval as srt

D = 40  # channels: 0-12 token one-hot, 13-22 retrieved digit, 23-39 scratch (23-33: a query)
RET = 13
SCRATCH = 23
QRY = 23


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


class LocalCopy(nn.Module):
    """A KDA-like short causal depthwise convolution (kernel size 4, only the current-token tap set to
    `weight`) from the token one-hot into the digit logits: it copies the local token and reads nothing
    beyond its 4-token window, so it retrieves nothing for gaps >= 3."""

    def __init__(self, weight: float):
        super().__init__()
        self.kernel_D1W = torch.zeros(10, 1, 4)
        self.kernel_D1W[..., -1] = weight

    def forward(self, h_BTD):
        x_BDT = torch.nn.functional.pad(h_BTD[..., :10].transpose(1, 2), (3, 0))  # causal left padding
        out = torch.zeros_like(h_BTD)
        out[..., RET:RET + 10] = torch.nn.functional.conv1d(x_BDT, self.kernel_D1W, groups=10).transpose(1, 2)
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
            if hasattr(layer.self_attn, "ids"):  # Retriever, Induction: hand-built "attention" by token ids
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
    """Per answer index k, layer 0 carries weight 1 and layer 1 weight k: over all answer positions
    score = sum / sum (0.4 and 0.6 for t=4), not the mean of per-item ratios (0.52 for layer 0). At the
    answer-predicting position alone (k = 0) only layer 0 retrieves: 1 and 0."""
    model = HandBuilt([Retriever([1.0] * 4), Retriever([0.0, 1.0, 2.0, 3.0])], ["kda", "full_attention"])
    a, b = pairs(gaps=(3, 6), t=4)
    rows = retrieval_scores(model, a, b, positions="all_answer").sort(["gap", "layer"])
    assert rows["score"].to_list() == pytest.approx([0.4, 0.6, 0.4, 0.6])
    assert rows["margin_clean"].to_list() == pytest.approx([2.5] * 4)  # mean over k of 1 + k
    assert rows["items"].to_list() == [6 * 4] * 4 and set(rows["positions"]) == {"all_answer"}
    rows = retrieval_scores(model, a, b).sort(["gap", "layer"])
    assert rows["score"].to_list() == pytest.approx([1.0, 0.0, 1.0, 0.0])
    assert rows["items"].to_list() == [6] * 4 and set(rows["positions"]) == {"answer_predicting"}


def test_default_patches_only_the_position_that_predicts_the_first_digit():
    """That position is the last prompt position (the second `$`, t+g+1): labels start right after it.
    Layer 0's output differs between A and B at every position from the second `$` on; "all_answer"
    patches positions t+g+1 .. 2t+g."""
    model = HandBuilt([Retriever(1.0), Retriever(1.0)], ["kda", "full_attention"])
    a, b = pairs(n=2, gaps=(5,), t=3)
    for positions, patched in (("answer_predicting", [9]), ("all_answer", [9, 10, 11])):
        seen = []  # the residual stream entering layer 1, i.e. after layer 0's (possibly patched) output
        hook = model.layers[1].self_attn.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
        rows = retrieval_scores(model, a, b, layers=[0], positions=positions)
        hook.remove()
        assert len(seen) == 3  # runs: B (captured), A clean, A with layer 0 patched
        assert torch.nonzero((seen[1] != seen[2]).any(-1).any(0)).flatten().tolist() == patched
        ret = slice(RET, RET + 10)  # layer 0's output channels hold B's output there (tokens stay A's)
        assert torch.equal(seen[2][:, patched, ret], seen[0][:, patched, ret])
        assert rows["items"].to_list() == [2 * len(patched)]
    ex = sr.build_example(a.digits_NK[0], 5)
    assert int(torch.nonzero(ex["labels"] != sr.IGNORE_INDEX)[0]) == 3 + 5 + 2


def _constant_pairs():
    """Digits repeat within an example, so the local token predicts the next answer digit (k >= 1)."""
    a = sr.RetrievalRecords(np.array([[3, 3, 3], [0, 0, 0]], np.uint8), np.array([4, 4]))
    b = sr.RetrievalRecords(np.array([[8, 8, 8], [5, 5, 5]], np.uint8), np.array([4, 4]))
    return a, b


def test_local_copier_that_retrieves_nothing_gets_no_score_by_default_but_full_score_over_all_answers():
    """LocalCopy reads only its 4-token window. At the answer-predicting position (second `$`, preceded
    by the gap's fill tokens) A and B look the same to it: patching moves nothing (margin_patched ==
    margin_clean == margin_b == 0) and the score is undefined, as for any model that retrieves nothing.
    Patching every answer position instead hands it B's teacher-forced answer copy: per example,
    k = 0 gives margin 0 in every run, k = 1, 2 give +1 clean, -1 on B, -1 patched, so
    score(layer 0) = (2 * 2 * 2) / (2 * 2 * 2) = 1 although layer 0 retrieves nothing."""
    model = HandBuilt([LocalCopy(1.0), Distractor()], ["kda", "full_attention"])
    a, b = _constant_pairs()
    rows = retrieval_scores(model, a, b).sort("layer")
    assert rows["margin_clean"].to_list() == [0.0, 0.0] and rows["margin_b"].to_list() == [0.0, 0.0]
    assert rows["margin_patched"].to_list() == [0.0, 0.0]
    assert all(math.isnan(x) for x in rows["score"].to_list())
    old = retrieval_scores(model, a, b, positions="all_answer").sort("layer")
    assert old["score"].to_list() == pytest.approx([1.0, 0.0])
    assert old["margin_clean"].to_list() == pytest.approx([2 / 3] * 2)
    assert old["margin_b"].to_list() == pytest.approx([-2 / 3] * 2)
    assert old["margin_patched"].to_list() == pytest.approx([-2 / 3, 2 / 3])


def test_local_copier_beside_a_retriever_scores_zero_by_default_hand_computed():
    """LocalCopy (weight c = 1) in KDA layer 0, a Retriever (weight r = 2) in attention layer 1; one pair
    A = 1 1 2, B = 4 4 5, gap 4. Answer-predicting position: m_clean = r, m_B = -r; patching layer 0
    changes nothing (score 0), patching layer 1 gives -r (score 1). All answer positions (k = 0, 1, 2):
    the copier adds +c to the clean margin at k = 1 (token 1 predicts 1) and -c to B's (token 4 predicts
    4), nothing at k = 2 (1 vs 2 / 5; 4 vs 2 / 5). m_clean = 3r + c, m_B = -3r - c; patched layer 0:
    r + (r - c) + r = 3r - c, patched layer 1: -3r + c. Scores 2c / (6r + 2c) = 1/7 and
    6r / (6r + 2c) = 6/7: the local layer scores without retrieving anything."""
    model = HandBuilt([LocalCopy(1.0), Retriever(2.0)], ["kda", "full_attention"])
    a = sr.RetrievalRecords(np.array([[1, 1, 2]], np.uint8), np.array([4]))
    b = sr.RetrievalRecords(np.array([[4, 4, 5]], np.uint8), np.array([4]))
    rows = retrieval_scores(model, a, b).sort("layer")
    assert rows["score"].to_list() == pytest.approx([0.0, 1.0], abs=1e-12)
    assert rows["margin_clean"].to_list() == pytest.approx([2.0, 2.0])
    assert rows["margin_patched"].to_list() == pytest.approx([2.0, -2.0])
    assert rows["n"].to_list() == [1, 1] and rows["items"].to_list() == [1, 1]
    old = retrieval_scores(model, a, b, positions="all_answer").sort("layer")
    assert old["score"].to_list() == pytest.approx([1 / 7, 6 / 7])
    assert old["margin_clean"].to_list() == pytest.approx([7 / 3] * 2)
    assert old["margin_b"].to_list() == pytest.approx([-7 / 3] * 2)
    assert old["margin_patched"].to_list() == pytest.approx([5 / 3, -5 / 3])
    assert old["items"].to_list() == [3, 3]


class LocalToken(nn.Module):
    """A KDA-like local path: writes the current token's one-hot (digits and `$`) into the query
    channels. It reads nothing but the current token, so it retrieves nothing."""

    def forward(self, h_BTD):
        out = torch.zeros_like(h_BTD)
        out[..., QRY:QRY + 11] = h_BTD[..., :11]
        return (out,)


class Induction(nn.Module):
    """An induction-style attention head: at each position from the second `$` on, it matches its query
    (the query channels) against the tokens of the stored prompt `$ X1 .. X(t-1)` (positions 0..t-1)
    and copies `weight` x the digit that follows each match into the retrieved-digit channels."""

    def __init__(self, weight: float, t: int):
        super().__init__()
        self.weight, self.t = weight, t
        self.ids = None

    def forward(self, h_BTD):
        out = torch.zeros_like(h_BTD)
        for b in range(h_BTD.shape[0]):
            d2 = int(torch.nonzero(self.ids[b] == sr.DOLLAR_ID)[1])
            keys_JC, values_JV = h_BTD[b, :self.t, :11], h_BTD[b, 1:self.t + 1, :10]
            match_PJ = h_BTD[b, d2:, QRY:QRY + 11] @ keys_JC.T
            out[b, d2:, RET:RET + 10] = self.weight * match_PJ @ values_JV
        return out, None


def test_local_layer_feeding_an_induction_head_on_random_pairs():
    """The mechanism the artefact needs in a trained model: KDA layer 0 passes the local token on (no
    retrieval), attention layer 1 uses it as the query that finds where to copy from. At the
    answer-predicting position the query is `$` in A and B alike: layer 0 scores exactly 0, layer 1
    exactly 1. Patching every answer position feeds B's answer tokens in as queries, so the head stops
    finding A's digits and layer 0 takes a large share although it retrieves nothing (~(t-1)/2t)."""
    t = 4
    model = HandBuilt([LocalToken(), Induction(1.0, t)], ["kda", "full_attention"])
    a, b = pairs(n=64, gaps=(3, 9), t=t)
    rows = retrieval_scores(model, a, b).sort(["gap", "layer"])
    old = retrieval_scores(model, a, b, positions="all_answer").sort(["gap", "layer"])
    assert rows["score"].to_list() == pytest.approx([0.0, 1.0, 0.0, 1.0], abs=1e-12)
    local = old.filter(pl.col("layer") == 0)["score"].to_list()
    assert all(0.2 < s < 0.6 for s in local), local


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


def _reference_scores(model, a, b, positions):
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
            if positions == "answer_predicting":  # the second `$`, t + g + 1
                pos, da, db = torch.tensor([a.t + g + 1]), da[:1], db[:1]

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


@pytest.mark.parametrize("positions", ["answer_predicting", "all_answer"])
def test_matches_naive_reference_on_a_real_hybrid(positions):
    cfg = srt.SRModelConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            intermediate_size=32, mixer_overrides={"chunk_size": 8})
    a, b = pairs(n=6, gaps=(2, 7), t=3)
    # a random model's mean margin difference may be negative (a NaN score): take the first seed that gives
    # one gap a positive denominator, so the comparison below covers real numbers
    for seed in range(16):
        model = srt.build_sr_model(cfg, seed=seed).double().eval()  # fp64: batched vs one-by-one agree to ~1e-12
        # sharpen the random model so margins are not tiny (its scores are meaningless but well defined)
        with torch.no_grad():
            model.lm_head.weight.mul_(20)
            ref = _reference_scores(model, a, b, positions)
        if any(not math.isnan(v) for by_layer in ref.values() for v in by_layer.values()):
            break
    model.train()  # retrieval_scores evaluates in eval mode and restores the caller's mode
    rows = retrieval_scores(model, a, b, batch_size=2, min_denominator=1e-9, positions=positions)
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
    with pytest.raises(HybridlabError, match="positions='every'.*answer_predicting"):
        retrieval_scores(model, a, b, positions="every")
