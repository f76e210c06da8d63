"""Layer importance: the one-layer-replaced KL and residual against hand-computed values, the group scores and
their bootstrap, and the search on a teacher with one irreplaceable layer against a control teacher."""

import math

import numpy as np
import polars as pl
import pytest
import torch

from hybridlab.errors import HybridlabError
from hybridlab.data.languages import language_group
from hybridlab.eval.layer_importance import (ROW_SCHEMA, group_languages, group_scores, importance_sentences,
                                             score_layers, searched_layers)
from hybridlab.models.placements import fa_layers, searched_group, top_layers
from tiny_models import tiny_qwen3

N_LAYERS, SPECIAL = 4, 2


def test_top_layers_and_groups():
    assert top_layers([0.1, 0.5, 0.5, 0.2], 2) == [1, 2]
    assert top_layers([0.3, 0.1, 0.3, 0.9], 2) == [0, 3]  # the tie at 0.3 goes to layer 0
    assert searched_group("searched") == "all" and searched_group("searched_nonlatin") == "nonlatin"
    assert searched_group("reverse_periodic") is None
    assert fa_layers("all_mixers", 6) == []
    with pytest.raises(HybridlabError, match="measured layer importance"):
        fa_layers("searched", 6, ratio=0.25)
    with pytest.raises(HybridlabError, match="not finite"):
        top_layers([0.1, math.nan], 1)
    assert [language_group(x, "eng_Latn") for x in ("eng_Latn", "fra_Latn", "zho_Hans")] == [
        "english", "latin", "nonlatin"]
    assert group_languages(["eng_Latn", "zho_Hans"], "eng_Latn") == {
        "all": ["eng_Latn", "zho_Hans"], "english": ["eng_Latn"], "nonlatin": ["zho_Hans"]}


def test_sentences_come_from_the_end_of_the_corpus():
    parallel = pl.DataFrame({"sid": [3, 1, 2, 1, 2], "lang": ["a_Latn"] * 3 + ["b_Hans"] * 2,
                             "text": ["s3", "s1", "s2", "t1", "t2"]})
    got = importance_sentences(parallel, ["a_Latn", "b_Hans"], 2)
    assert got["text"].to_list() == ["s2", "s3", "t1", "t2"]
    with pytest.raises(HybridlabError, match="fewer than the 3"):
        importance_sentences(parallel, ["b_Hans"], 3)


def test_group_scores_weigh_languages_equally():
    # layer 0: English KL 1 nat/token on 1 sentence of 4 tokens; French 3 nat/token on 2 sentences (2 + 6 tokens)
    rows = pl.DataFrame(
        [{"layer": 0, "lang": "eng_Latn", "sid": 0, "kl_tokens": 4, "kl_sum": 4.0, "res_tokens": 5, "res_sum": 5.0,
          "ref_sum": 10.0},
         {"layer": 0, "lang": "fra_Latn", "sid": 0, "kl_tokens": 2, "kl_sum": 6.0, "res_tokens": 3, "res_sum": 3.0,
          "ref_sum": 3.0},
         {"layer": 0, "lang": "fra_Latn", "sid": 1, "kl_tokens": 6, "kl_sum": 18.0, "res_tokens": 7, "res_sum": 7.0,
          "ref_sum": 7.0},
         {"layer": 1, "lang": "eng_Latn", "sid": 0, "kl_tokens": 4, "kl_sum": 2.0, "res_tokens": 5, "res_sum": 1.0,
          "ref_sum": 10.0},
         {"layer": 1, "lang": "fra_Latn", "sid": 0, "kl_tokens": 2, "kl_sum": 1.0, "res_tokens": 3, "res_sum": 0.0,
          "ref_sum": 3.0},
         {"layer": 1, "lang": "fra_Latn", "sid": 1, "kl_tokens": 6, "kl_sum": 3.0, "res_tokens": 7, "res_sum": 0.0,
          "ref_sum": 7.0}], schema=ROW_SCHEMA)
    s = group_scores(rows, "eng_Latn", 1, n_boot=50, seed=0)
    by = {(r["group"], r["layer"]): r for r in s.iter_rows(named=True)}
    assert by[("all", 0)]["kl"] == pytest.approx((1.0 + 3.0) / 2)  # not the token-pooled 28/12
    assert by[("latin", 0)]["kl"] == pytest.approx(3.0) and by[("english", 1)]["kl"] == pytest.approx(0.5)
    assert by[("all", 0)]["residual"] == pytest.approx((1.0 + 1.0) / 2)
    # French's residual is 1 per token in both sentences: its interval is the point
    assert by[("latin", 0)]["residual_lo"] == pytest.approx(1.0) == by[("latin", 0)]["residual_hi"]
    assert by[("english", 0)]["residual_rel"] == pytest.approx(0.5)
    assert by[("all", 0)]["chosen"] and not by[("all", 1)]["chosen"]
    assert by[("all", 0)]["p_top"] == 1.0  # layer 0 beats layer 1 in every sentence
    # French's two sentences have the same per-token KL, so every resample gives it exactly 3
    assert by[("latin", 0)]["kl_lo"] == pytest.approx(3.0) and by[("latin", 0)]["kl_hi"] == pytest.approx(3.0)
    assert set(s["group"]) == {"all", "english", "latin"}
    assert searched_layers(s, "all", 2, 1) == ([0], [2.0, pytest.approx(0.5)])
    with pytest.raises(HybridlabError, match="no group 'nonlatin'"):
        searched_layers(s, "nonlatin", 2, 1)
    with pytest.raises(HybridlabError, match="not the teacher's 3"):
        searched_layers(s, "all", 3, 1)


def _sentences(n=12, length=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [length - (i % 5) for i in range(n)]
    return [torch.randint(0, 64, (k,), generator=g).tolist() for k in lengths]


def test_the_attention_itself_scores_zero():
    """Swapping a layer's attention for itself changes nothing: KL and residual are 0 on every sentence."""
    teacher = tiny_qwen3(seed=0, num_hidden_layers=3).eval()
    same = {i: layer.self_attn for i, layer in enumerate(teacher.model.layers)}
    ids = _sentences(6)
    rows = score_layers(teacher, same, ids, ["eng_Latn"] * 6, list(range(6)), batch_size=4)
    assert rows.height == 3 * 6
    assert rows["kl_sum"].abs().max() < 1e-5 and rows["res_sum"].abs().max() < 1e-8
    assert rows.filter(pl.col("layer") == 0)["kl_tokens"].to_list() == [len(s) - 1 for s in ids]


def test_one_layer_replacement_matches_a_direct_forward():
    """The KL of layer 1 equals the KL of a separately built teacher whose layer 1 is the mixer, one sentence at a
    time (so right-padding inside the batch changes nothing)."""
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.train.distill import mixer_wrappers

    teacher = tiny_qwen3(seed=1, num_hidden_layers=3).eval()
    student = convert_to_hybrid(teacher, [], "gdn", seed=0)
    mixers = mixer_wrappers(student)
    ids = _sentences(5, seed=2)
    rows = score_layers(teacher, mixers, ids, ["eng_Latn"] * 5, list(range(5)), batch_size=5)
    hybrid = convert_to_hybrid(teacher, [0, 2], "gdn", seed=0)
    hybrid.model.layers[1].self_attn = mixers[1]
    for j, s in enumerate(ids):
        x = torch.tensor([s])
        with torch.no_grad():
            lp_t = torch.log_softmax(teacher(input_ids=x).logits, -1)[0, :-1]
            lp_h = torch.log_softmax(hybrid(input_ids=x).logits, -1)[0, :-1]
        kl = float((lp_t.exp() * (lp_t - lp_h)).sum())
        got = rows.filter((pl.col("layer") == 1) & (pl.col("sid") == j))["kl_sum"][0]
        assert got == pytest.approx(kl, rel=1e-4, abs=1e-7)


def _importance(teacher, steps=30):
    """Stage-1 mixers of an all-mixers student (a few alignment steps), then the scores of one teacher."""
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.train.distill import Stage1Task, freeze_all_but_mixers, mixer_wrappers

    student = convert_to_hybrid(teacher, [], "gdn", seed=0)
    freeze_all_but_mixers(student)
    task = Stage1Task(teacher, student)
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=3e-3)
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        loss, _ = task.loss(student, torch.randint(0, 64, (8, 32), generator=g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    task.close()
    ids = _sentences(24, seed=3)
    langs = ["eng_Latn"] * 8 + ["fra_Latn"] * 8 + ["zho_Hans"] * 8
    rows = score_layers(teacher, mixer_wrappers(student), ids, langs, list(range(24)), batch_size=8)
    return group_scores(rows, "eng_Latn", 1, n_boot=100, seed=0).filter(pl.col("group") == "all").sort("layer")


def test_search_keeps_an_irreplaceable_layer_and_not_in_the_control():
    """Layer 2 of the teacher is made irreplaceable: its query/key projections are scaled up (a sharp softmax that
    picks single earlier tokens) and its value/output projections too, so it writes a large copy of those tokens
    into the residual stream, which a recurrent mixer reproduces only approximately. The search keeps it in every
    bootstrap; in the control teacher (the same weights unscaled) layer 2 is neither chosen nor above the rest."""
    torch.manual_seed(0)
    control = tiny_qwen3(seed=4, num_hidden_layers=N_LAYERS).eval()
    special = tiny_qwen3(seed=4, num_hidden_layers=N_LAYERS).eval()
    with torch.no_grad():
        attn = special.model.layers[SPECIAL].self_attn
        for proj, scale in ((attn.q_proj, 4.0), (attn.k_proj, 4.0), (attn.v_proj, 8.0), (attn.o_proj, 8.0)):
            proj.weight.mul_(scale)
    s = _importance(special)
    kl = s["kl"].to_numpy()
    others = np.delete(kl, SPECIAL)
    assert s.filter(pl.col("chosen"))["layer"].to_list() == [SPECIAL]
    assert s["p_top"][SPECIAL] >= 0.95
    assert kl[SPECIAL] > 3 * others.max()
    c = _importance(control)
    c_kl = c["kl"].to_numpy()
    assert not c["chosen"][SPECIAL] and c["p_top"][SPECIAL] < 0.5
    assert c_kl[SPECIAL] <= np.median(np.delete(c_kl, SPECIAL))
