"""The rehearsal preset end to end: the paper preset's code paths on CPU at miniature size.

In its own repository (tests/smoke.py, `make_rehearsal_repo`): the smoke corpus, the local hub
copies and random hub-architecture models, then `snakemake all --config scale=rehearsal`, as `make
rehearsal` does; the tests check what only the paper path produces: hub-loader data, two teachers with
their own tokenizers, 2-process FSDP2 training with DCP shards, the published-pair analyses, and
lm-eval on the local task.
"""

import json

import numpy as np
import polars as pl
import pytest

from smoke import make_rehearsal_repo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    return make_rehearsal_repo(tmp_path_factory.mktemp("rehearsal"))


def test_each_teacher_trains_on_its_own_tokens(rehearsal):
    data = rehearsal / "results" / "data" / "rehearsal"
    vocab = {}
    for name, model in (("qwen3", "qwen3-teacher"), ("granite4", "granite-teacher")):
        cfg = json.loads((rehearsal / "cache" / "rehearsal" / "models" / model / "config.json").read_text())
        vocab[name] = cfg["vocab_size"]
        stats = json.loads((data / "mixture" / name / "multilingual" / "stats.json").read_text())
        assert stats["max_token_id"] < cfg["vocab_size"]
    assert vocab["qwen3"] != vocab["granite4"]  # two tokenizers, two mixtures


def test_training_ran_on_two_processes_with_sharded_checkpoints(rehearsal):
    runs = rehearsal / "results" / "train" / "rehearsal" / "runs"
    shards = sorted(p.name for p in runs.rglob("*.distcp"))
    assert shards and {"__0_0.distcp", "__1_0.distcp"} <= set(shards)


def test_published_pairs_and_lm_eval(rehearsal):
    ev = rehearsal / "results" / "eval" / "rehearsal"
    soft = pl.read_parquet(ev / "softcka.parquet")
    pairs = set(soft["pair"].unique())
    assert {"qwen3.5-vs-qwen3", "olmo-hybrid-vs-olmo-3", "granitemoehybrid-vs-granite"} <= pairs
    lm = pl.read_parquet(ev / "lm_benchmarks.parquet")
    assert "hybridlab_local_recall" in set(lm["task"])
    vals = lm.filter(pl.col("task") == "hybridlab_local_recall")["value"].to_numpy()
    assert np.isfinite(vals).all() and ((vals >= 0) & (vals <= 1)).all()
    figures = rehearsal / "results" / "figures" / "rehearsal"
    assert (figures / "table_lm_benchmarks.csv").is_file() and len(list(figures.glob("fig_*.png"))) >= 10


def test_bld_sr_findings_bracket_the_takeover(rehearsal):
    """The paper's update arms in miniature reach the findings table: each freeze arm's accuracy row with
    the sign its start gives, the gradient-norm and first-checkpoint rows, undefined seeds counted."""
    table = pl.read_csv(rehearsal / "results" / "figures" / "rehearsal" / "table_findings.csv")
    bld = table.filter(pl.col("study") == "competing learning (BLD)")
    assert "n_undefined" in bld.columns and (bld["n_undefined"] >= 0).all()
    freeze = bld.filter(pl.col("finding").str.starts_with("freezing the recurrent layers before the takeover"))
    assert sorted(freeze["comparison"]) == ["freeze0-2u vs baseline", "window4u+2u vs baseline"]
    # frozen from update 0: before any takeover (the first checkpoint after the initial one is update 2)
    assert freeze.filter(pl.col("comparison") == "freeze0-2u vs baseline")["expected"].to_list() in (["+"], [None])
    grad = bld.filter(pl.col("finding").str.starts_with("attention's gradient norm is larger"))
    assert sorted(grad["comparison"]) == ["freeze0-2u vs baseline", "window4u+2u vs baseline"]
    assert "the recurrent layers take the retrieval first" in set(bld["finding"])
    assert (bld["n_seeds"] == 2).sum() >= 6  # the BLD-SR rows run both rehearsal seeds


def test_niah_runs_oneruler_prompts_with_yarn_and_records_the_settings(rehearsal):
    """The paper preset's NIAH path (prompts: oneruler, chat_template: true, yarn_factor): every summary row names
    the prompts and the YaRN factor that were applied. The rehearsal's random tokenizers carry no chat template,
    so the table records that none was applied (the template path itself: tests/eval/test_oneruler.py)."""
    niah = pl.read_parquet(rehearsal / "results" / "eval" / "rehearsal" / "niah.parquet")
    assert niah.height > 0 and set(niah["prompts"]) == {"oneruler"}
    assert set(niah["yarn_factor"].drop_nulls()) == {2.0}  # rehearsal preset: yarn_factor 2.0 (null: a NoPE model)
    assert not niah["chat_template"].any()
    assert set(niah["task"]) == {"niah_single", "niah_none"}


def test_longppl_external_evaluator_and_the_multilinguality_findings(rehearsal):
    from hybridlab.plots import findings_multi as M

    summary = pl.read_parquet(rehearsal / "results" / "eval" / "rehearsal" / "position_loss_summary.parquet")
    # the paper path: the key tokens come from the teacher with the BLD-NL tokenizer, the same for every arm
    assert set(summary["evaluator"]) == {"rehearsal/qwen3-teacher"} and summary["n_key_tokens"].n_unique() == 1
    table = pl.read_csv(rehearsal / "results" / "figures" / "rehearsal" / "table_findings.csv")
    assert {M.ATTN_DELTA_FA, M.SWA_FLAT, M.RECENCY, M.FERTILITY_MAX, M.NIAH_RUNTIME, M.TOP_KL, M.NON_LATIN} <= set(
        table["finding"])
    # the pair without a dense model gets the sliding-window row, not the hybrids' first-FA row
    swa = table.filter(pl.col("comparison") == "swa-olmo-3")
    assert M.SWA_FLAT in set(swa["finding"]) and not swa["finding"].str.starts_with("the largest").any()
    # a row without an estimate is never reproduced
    assert table.filter(pl.col("effect").is_null() | pl.col("effect").is_nan())["verdict"].is_in(
        ["inconclusive"]).all()
    # two NIAH lengths: each hybrid-vs-dense pair of the DAG gets its length row, and so do the BLD-NL arms'
    # retrieval-heads (two KV heads: the last-one row) and lm-eval recall rows
    from hybridlab.plots.findings import NIAH_LENGTH

    length = table.filter((pl.col("finding") == NIAH_LENGTH) & (pl.col("comparison") != "swa-olmo-3"))
    assert length.height >= 1 and length["effect"].is_not_nan().all()
    assert sorted(table.filter(pl.col("source") == "retrieval_heads_masking")["comparison"]) == [
        "gdn: bld vs baseline", "kda: bld vs baseline"]
    assert sorted(table.filter(pl.col("source") == "lm_benchmarks")["comparison"]) == [
        "gdn: bld vs baseline", "kda: bld vs baseline"]


def test_searched_placement_comes_from_the_layer_importance(rehearsal):
    """Each teacher's all_mixers stage-1 run gives its importance table; the searched_nonlatin student keeps the
    FA layers that table ranks highest for the non-Latin group, records them in hybrid.json, and the findings
    table has the layer-0 row of every teacher and group."""
    from hybridlab.eval.layer_importance import searched_layers
    from hybridlab.plots import findings_multi as M

    scores = pl.read_parquet(rehearsal / "results" / "eval" / "rehearsal" / "layer_importance.parquet")
    assert set(scores["group"]) == {"all", "english", "latin", "nonlatin"}
    for (teacher,), g in scores.group_by(["teacher"]):
        slug = teacher.replace("/", "--")
        spec = json.loads((rehearsal / "results" / "models" / "rehearsal" / "students" / "seed0" / slug
                           / "searched_nonlatin-gdn" / "hybrid.json").read_text())
        n_layers = g["layer"].n_unique()
        want, kl = searched_layers(g, "nonlatin", n_layers, g["n_fa"][0])
        assert spec["fa_layers"] == want and spec["extra"]["search"]["kl_by_layer"] == pytest.approx(kl)
        assert g.filter(pl.col("chosen") & (pl.col("group") == "nonlatin"))["layer"].to_list() == want
    table = pl.read_csv(rehearsal / "results" / "figures" / "rehearsal" / "table_findings.csv")
    assert table.filter(pl.col("finding") == M.SEARCH_LAYER0).height == scores.select("teacher", "group").n_unique()
    assert (rehearsal / "results" / "figures" / "rehearsal" / "fig_layer_importance.png").is_file()


def test_a_second_distillation_seed_gives_softcka_findings_an_interval_over_seeds(rehearsal):
    """Standard periodic's second seed: its own shared stage 1 and student per teacher, the further seed's SoftCKA
    table (eval_softcka_seed: the seed-1 students, their teachers' rows from the first-seed jobs), and the
    hybrid-vs-dense rows of that placement decided over both seeds; the one-seed placement keeps one."""
    ev = rehearsal / "results" / "eval" / "rehearsal"
    second = pl.read_parquet(ev / "softcka_seed1.parquet")
    hybrids = sorted(second.filter(pl.col("role") == "hybrid")["model"].unique())
    assert len(hybrids) == 2 and all("standard_periodic" in m for m in hybrids), hybrids
    assert sorted(second.filter(pl.col("role") == "dense")["model"].unique()) == [
        "rehearsal/granite-teacher", "rehearsal/qwen3-teacher"]
    # the seed-1 students are other models than seed 0's of the same name: every hybrid value differs
    key = ["model", "pair", "kind", "layer", "lang"]
    first = pl.read_parquet(ev / "softcka.parquet").filter(pl.col("role") == "hybrid")
    both = first.join(second.filter(pl.col("role") == "hybrid"), on=key, suffix="_seed1")
    assert both.height == second.filter(pl.col("role") == "hybrid").height > 0
    assert (both["cka"] != both["cka_seed1"]).all()
    table = pl.read_csv(rehearsal / "results" / "figures" / "rehearsal" / "table_findings.csv")
    aligned = table.filter(pl.col("finding") == "hybrids are less cross-lingually aligned than dense models")
    periodic = aligned.filter(pl.col("comparison").str.contains("standard_periodic"))
    searched = aligned.filter(pl.col("comparison").str.contains("searched_nonlatin"))
    assert periodic.height == 2 and (periodic["n_seeds"] == 2).all()
    assert set(periodic["ci_over"]) == {"seeds (t-interval)"}
    assert searched.height == 2 and (searched["n_seeds"] == 1).all()
