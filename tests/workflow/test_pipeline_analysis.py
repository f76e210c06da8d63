"""SoftCKA, attention recency, fertility and NIAH tables end to end at `smoke` (distilled students vs teacher)."""

import json
import subprocess
import sys

import polars as pl
import pytest
import torch
from smoke import ROOT, build

from hybridlab.eval import pairs
from hybridlab.eval.capture import capture_hidden_states
from hybridlab.eval.softcka import soft_cka

pytestmark = pytest.mark.smoke_dag  # built in the session's smoke repository (tests/conftest.py)

PLACEMENTS = ["sandwich", "standard_periodic"]  # the smoke preset's (config.yaml)
MODELS = {"teacher"} | {f"teacher/{p}-gdn" for p in PLACEMENTS}
TABLES = ["softcka", "recency", "fertility", "niah"]


def _params(work, section):
    """The rule's --params, read back from the provenance record the script wrote."""
    return json.loads((work / f"results/eval/smoke/{section}.parquet.provenance.json").read_text())["params"]


@pytest.fixture(scope="module")
def analysis(smoke_workdir):
    build(smoke_workdir, *[f"results/eval/smoke/{t}.parquet" for t in TABLES])
    return smoke_workdir


@pytest.mark.slow
def test_softcka_table_matches_a_direct_computation(analysis):
    work = analysis
    t = pl.read_parquet(work / "results/eval/smoke/softcka.parquet")
    assert t.columns == ["model", "pair", "role", "kind", "layer", "layer_type", "lang", "cka", "cka_lo", "cka_hi",
                         "cka_debiased", "alignment", "alignment_lo", "alignment_hi", "alignment_method",
                         "alignment_gram_rows", "alignment_pooled", "language_offset", "language_offset_lo",
                   "language_offset_hi", "mmd", "n_sentences", "method", "sigma_eng", "sigma_x", "sigma_pair",
                         "sigma_convention"]
    assert (t["cka_lo"] <= t["cka_hi"]).all() and t["cka_lo"].is_not_nan().all()  # smoke: softcka.n_boot 100
    # the gather's record names the models; the settings are in each per-model job's record
    assert set(_params(work, "softcka")["models"]) == MODELS
    params = _params(work, "softcka/seed0/teacher--sandwich-gdn")
    cfg = params["softcka"]
    langs = cfg["languages"]
    assert set(t["model"]) == MODELS and set(t["lang"]) == set(langs) and set(t["method"]) == {"exact"}
    # every layer of both kinds, once per (model, pair, lang); the teacher appears once per student pair
    for kind, n in (("hidden", 5), ("attn_delta", 4)):
        per = t.filter(pl.col("kind") == kind).group_by("model", "pair", "lang").agg(pl.col("layer").sort())
        assert all(layers.to_list() == list(range(n)) for layers in per["layer"]), kind
    teacher = t.filter(pl.col("model") == "teacher")
    assert set(teacher["pair"]) == MODELS - {"teacher"} and set(teacher["role"]) == {"dense"}
    assert teacher.group_by("kind", "layer", "lang").agg(pl.col("cka").n_unique())["cka"].max() == 1
    student = t.filter(pl.col("model") == "teacher/sandwich-gdn")
    spec = json.loads((work / "results/train/smoke/distill/seed0/teacher/sandwich-gdn/stage2/hybrid.json").read_text())
    types = {(r["kind"], r["layer"]): r["layer_type"] for r in student.iter_rows(named=True)}
    assert types[("hidden", 0)] == "embedding"
    assert [types[("attn_delta", i)] for i in range(4)] == spec["layer_types"]
    assert [types[("hidden", i + 1)] for i in range(4)] == spec["layer_types"]
    assert t["cka"].is_between(0, 1).all() and t["alignment"].is_between(-1, 1).all()
    assert (t["n_sentences"] == cfg["n_sentences"]).all()

    # Recompute one cell from the library: same sentences (seeded sample), same model, same layer.
    parallel = pl.read_parquet(work / "results/data/smoke/corpus/parallel.parquet")
    texts = pairs.parallel_sample(parallel, "eng_Latn", langs, cfg["n_sentences"], params["seed"])
    m = pairs.AnalysisModel("s", str(work / "results/train/smoke/distill/seed0/teacher/sandwich-gdn/stage2"),
                            str(work / "results/data/smoke/tokenizer/bpe"))
    model, tok = pairs.load_analysis_model(m)
    lang = langs[-1]
    eng = capture_hidden_states(model, tok, texts["eng_Latn"], layers=[2], with_attn_delta=False)
    x = capture_hidden_states(model, tok, texts[lang], layers=[2], with_attn_delta=False)
    ref = soft_cka(eng.flat("hidden", 2), x.flat("hidden", 2), seed=params["seed"])
    row = student.filter((pl.col("kind") == "hidden") & (pl.col("layer") == 2) & (pl.col("lang") == lang)).row(
        0, named=True)
    assert row["cka"] == pytest.approx(ref.cka, abs=1e-6)
    assert row["cka_debiased"] == pytest.approx(ref.cka_debiased, abs=1e-6)
    assert row["alignment"] == pytest.approx(ref.alignment, abs=1e-6)
    assert row["alignment_gram_rows"] == pytest.approx(ref.alignment_gram_rows, abs=1e-6)
    assert row["alignment_pooled"] == pytest.approx(ref.alignment_pooled, abs=1e-6)
    assert row["language_offset"] == pytest.approx(ref.language_offset, abs=1e-6) and row["language_offset"] > 0
    assert row["sigma_pair"] == pytest.approx(ref.sigma_pair, rel=1e-6) and row["alignment_method"] == "kme"


@pytest.mark.slow
def test_recency_table_reads_exactly_the_full_attention_layers(analysis):
    work = analysis
    t = pl.read_parquet(work / "results/eval/smoke/recency.parquet")
    assert t.columns == ["model", "pair", "role", "lang", "layer", "head", "window", "mass", "mass_lo", "mass_hi",
                         "mean_distance", "mean_distance_lo", "mean_distance_hi", "n_sequences", "input_tokens",
                         "n_boot"]
    assert ((t["mass_lo"] <= t["mass"] + 1e-12) & (t["mass"] <= t["mass_hi"] + 1e-12)).all()
    cfg = _params(work, "recency")["recency"]
    assert set(t["model"]) == MODELS and set(t["lang"]) == set(cfg["languages"])
    assert sorted(t.filter(pl.col("model") == "teacher")["layer"].unique()) == [0, 1, 2, 3]
    for p in PLACEMENTS:
        spec = json.loads((work / f"results/train/smoke/distill/seed0/teacher/{p}-gdn/stage2/hybrid.json").read_text())
        assert sorted(t.filter(pl.col("model") == f"teacher/{p}-gdn")["layer"].unique()) == spec["fa_layers"], p
    assert t["head"].n_unique() == 4 and t["mass"].is_between(0, 1 + 1e-6).all()
    # mass on the last w keys grows with w; the mean distance is below the input length
    wide = t.pivot(on="window", index=["model", "pair", "lang", "layer", "head"], values="mass")
    small, large = sorted(cfg["windows"])
    assert (wide[str(small)] <= wide[str(large)] + 1e-6).all()
    assert (t["mean_distance"] < cfg["input_tokens"]).all() and (t["mean_distance"] > 0).all()


@pytest.mark.slow
def test_recency_of_an_inherited_attention_layer_equals_the_teachers(analysis, tmp_path):
    """Converted (not distilled) students keep the teacher's layers below their first mixer, so the
    attention probabilities of FA layer 0 - and every recency number of it - are the teacher's."""
    work = analysis
    params = _params(work, "recency")
    for d in params["models"]["distilled"]:
        d["student_path"] = d["student_path"].replace("results/train/smoke/distill", "results/models/smoke/students") \
            .removesuffix("/stage2")
        d["student_path"] = str(work / d["student_path"])
        d["teacher_path"] = str(work / d["teacher_path"])
        d["tokenizer"] = str(work / d["tokenizer"])
    out = tmp_path / "recency.parquet"
    proc = subprocess.run([sys.executable, str(ROOT / "workflow_scripts/eval_recency.py"), "--params",
                           json.dumps(params), "--mono", str(work / "results/data/smoke/corpus/mono.parquet"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    t = pl.read_parquet(out).filter(pl.col("layer") == 0)
    keys = ["lang", "head", "window"]
    ref = t.filter(pl.col("model") == "teacher").unique(keys).sort(keys)
    sandwich = t.filter(pl.col("model") == "teacher/sandwich-gdn").sort(keys)  # FA layers [0] at 4 layers
    assert sandwich.height == ref.height > 0
    assert torch.allclose(torch.tensor(sandwich["mass"].to_list()), torch.tensor(ref["mass"].to_list()), atol=1e-5)
    assert torch.allclose(torch.tensor(sandwich["mean_distance"].to_list()),
                          torch.tensor(ref["mean_distance"].to_list()), atol=1e-4)


@pytest.mark.slow
def test_fertility_table_matches_token_counts(analysis):
    work = analysis
    t = pl.read_parquet(work / "results/eval/smoke/fertility.parquet")
    assert t.columns == ["tokenizer", "lang", "n_sentences", "tokens_per_sentence", "relative_to_english",
                         "mean_sentence_ratio", "relative_to_english_lo", "relative_to_english_hi"]
    assert set(t["tokenizer"]) == {"project", "utf8_bytes"}
    eng = t.filter(pl.col("lang") == "eng_Latn")
    assert (eng["relative_to_english"] == 1.0).all()
    parallel = pl.read_parquet(work / "results/data/smoke/corpus/parallel.parquet")
    from hybridlab.models.registry import load_tokenizer_for

    tok = load_tokenizer_for(work / "results/data/smoke/tokenizer/bpe")
    for lang in ("zho_Hans", "hin_Deva"):
        texts = {code: parallel.filter(pl.col("lang") == code).sort("sid")["text"].to_list()
                 for code in (lang, "eng_Latn")}
        n = {code: sum(len(tok(s, add_special_tokens=False)["input_ids"]) for s in v) for code, v in texts.items()}
        b = {code: sum(len(s.encode()) for s in v) for code, v in texts.items()}
        row = t.filter(pl.col("lang") == lang)
        assert row.filter(pl.col("tokenizer") == "project")["relative_to_english"][0] == pytest.approx(
            n[lang] / n["eng_Latn"])
        assert row.filter(pl.col("tokenizer") == "utf8_bytes")["relative_to_english"][0] == pytest.approx(
            b[lang] / b["eng_Latn"])


@pytest.mark.slow
def test_niah_summary_agrees_with_its_examples(analysis):
    work = analysis
    summary = pl.read_parquet(work / "results/eval/smoke/niah.parquet")
    examples = pl.read_parquet(work / "results/eval/smoke/niah_examples.parquet")
    # one NIAH job per model and a gather job (whose record names the models): the settings come from the preset
    from hybridlab.config import load, resolve

    cfg = resolve(load(work / "config.yaml", {"scale": "smoke"}))["eval"]["analysis"]["niah"]
    assert summary.columns[:8] == ["model", "pair", "role", "lang", "task", "context_tokens", "n", "accuracy"]
    assert {"seconds", "peak_memory_bytes", "oom", "oom_rate", "mean_prompt_tokens"} <= set(summary.columns)
    # smoke: the project's English templates, no chat template (its BPE tokenizer has none), no RoPE scaling
    assert summary.columns[-4:] == ["prompts", "chat_template", "yarn_factor", "memory_cap_gib"]
    assert (summary["prompts"] == "project").all() and not summary["chat_template"].any()
    assert summary["yarn_factor"].null_count() == summary.height
    n_cells = len(cfg["languages"]) * len(cfg["tasks"]) * len(cfg["context_tokens"])
    assert summary.filter(pl.col("model") == "teacher").height == n_cells * len(PLACEMENTS)
    assert set(summary["model"]) == MODELS and (summary["n"] == cfg["examples_per_cell"]).all()
    assert (examples["context_tokens"] <= examples["target_tokens"]).all()
    assert examples["prediction"].null_count() == 0 and not examples["oom"].any()
    assert (examples["seconds"] > 0).all() and (examples["peak_memory_bytes"] > 0).all()
    mean_correct = (examples.group_by("model", "pair", "lang", "task", "target_tokens")
                    .agg(pl.col("correct").cast(pl.Float64).mean().alias("acc")))
    joined = summary.join(mean_correct, left_on=["model", "pair", "lang", "task", "context_tokens"],
                          right_on=["model", "pair", "lang", "task", "target_tokens"])
    assert joined.height == summary.height and (joined["accuracy"] == joined["acc"]).all()


@pytest.mark.slow
def test_analysis_rules_fit_the_smoke_budget_and_record_provenance(analysis):
    for name in TABLES:
        record = json.loads((analysis / f"results/eval/smoke/{name}.parquet.provenance.json").read_text())
        if name == "niah":  # one job per model (benchmarks/niah/<model>.tsv), gathered into niah.parquet
            benches = sorted((analysis / "results/eval/smoke/benchmarks/niah").glob("*.tsv"))
            assert len(benches) == len(record["params"]["models"]) == len(MODELS)
        elif name == "softcka":  # likewise (benchmarks/softcka/seed<N>/<model>.tsv)
            benches = sorted((analysis / "results/eval/smoke/benchmarks/softcka").glob("seed*/*.tsv"))
            assert len(benches) == len(record["params"]["models"]) == len(MODELS)
        else:
            benches = [analysis / f"results/eval/smoke/benchmarks/{name}.tsv"]
            assert record["params"]["seed"] == 1234
        for f in benches:
            bench = pl.read_csv(f, separator="\t")
            assert bench["s"][0] < 120, f"{f.name} took {bench['s'][0]:.0f}s at smoke"
