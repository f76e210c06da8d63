"""Figures and tables from small synthetic tables with the documented columns; byte-stable saving."""

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from hybridlab.errors import HybridlabError
from hybridlab.plots import figures, registry
from hybridlab.plots import tables as plot_tables
from hybridlab.plots.style import save_all, save_figure

ROOT = Path(__file__).resolve().parents[2]
LANGS = ["hin_Deva", "rus_Cyrl"]
HYB = ["gdn", "full_attention", "gdn", "full_attention"]  # decoder layer types of the synthetic hybrid


def _softcka():
    rows = []
    for model, role, types in [("teacher", "dense", ["full_attention"] * 4), ("teacher/sp-gdn", "hybrid", HYB)]:
        for kind in ("hidden", "attn_delta"):
            layers = range(5) if kind == "hidden" else range(4)
            for layer in layers:
                lt = ("embedding" if layer == 0 else types[layer - 1]) if kind == "hidden" else types[layer]
                for i, lang in enumerate(LANGS):
                    rows.append(dict(model=model, pair="teacher vs sp-gdn", role=role, kind=kind, layer=layer,
                                     layer_type=lt, lang=lang, cka=0.9 - 0.1 * layer - 0.05 * i,
                                     cka_debiased=0.5, alignment=0.3, n_sentences=8, method="exact",
                                     sigma_eng=1.0, sigma_x=1.0))
    return pl.DataFrame(rows)


def _recency():
    rows = []
    for model, role, layers in [("teacher", "dense", [0, 1, 2, 3]), ("teacher/sp-gdn", "hybrid", [1, 3])]:
        for layer in layers:
            for head in range(2):
                for w in (1, 4, 16):
                    rows.append(dict(model=model, pair="teacher vs sp-gdn", role=role, lang="hin_Deva", layer=layer,
                                     head=head, window=w, mass=min(1.0, 0.1 * w), mean_distance=3.0 + layer + head,
                                     n_sequences=2, input_tokens=32))
    return pl.DataFrame(rows)


def _fertility():
    return pl.DataFrame([dict(tokenizer=t, lang=l, n_sentences=10, tokens_per_sentence=5.0 * r,
                              relative_to_english=r, mean_sentence_ratio=r)
                         for t, f in [("project", 1.0), ("utf8_bytes", 2.0)]
                         for l, r in [("eng_Latn", 1.0), ("hin_Deva", 1.5 * f), ("rus_Cyrl", 1.2 * f)]])


def _niah():
    rows = []
    for model, role in [("teacher", "dense"), ("teacher/sp-gdn", "hybrid")]:
        for lang in LANGS:
            for task in ("niah_single", "niah_none"):
                for ctx in (64, 128, 256):
                    oom = role == "dense" and ctx == 256
                    rows.append(dict(model=model, pair="teacher vs sp-gdn", role=role, lang=lang, task=task,
                                     context_tokens=ctx, n=2, accuracy=0.0 if oom else 0.5, score=0.5,
                                     mean_prompt_tokens=ctx - 3, seconds=0.01 * ctx, peak_memory_bytes=1000,
                                     memory_kind="rss", oom=oom, oom_rate=1.0 if oom else 0.0))
    return pl.DataFrame(rows)


def _distill_runs():
    frames = {}
    for j, p in enumerate(["sandwich", "standard_periodic"]):
        frames[f"teacher/{p}-gdn"] = pl.DataFrame(dict(
            step=[0, 2, 4], tokens=[0, 512, 1024], loss=[None, 1.0, 0.9], **{
                "eval/ce": [5.0, 4.8 - 0.1 * j, 4.6 - 0.1 * j], "eval/kl": [0.5, 0.3, 0.2 - 0.05 * j],
                f"eval/ce/{LANGS[j]}": [5.1, 4.9, 4.7]}))
    return plot_tables.concat_runs(frames)


def _tokens():
    return pl.DataFrame([dict(teacher="teacher", mixer="gdn", placement=p, metric=m, lang=l, target=4.6,
                              tokens=None if p == "sandwich" else 512.0, baseline_tokens=1024.0,
                              fraction=None if p == "sandwich" else f, final=4.5)
                         for p, f in [("sandwich", None), ("standard_periodic", 1.0), ("endpoint_spread", 0.5)]
                         for m in ("ce", "kl") for l in ("all", "hin_Deva")])


def _bld_sr_runs():
    frames = {}
    for j, arm in enumerate(["baseline", "freeze0-0.2", "longgap0.25", "longgap0.75"]):
        frames[arm] = pl.DataFrame({
            "step": [1, 2, 3, 4], "tokens": [10, 20, 30, 40], "loss": [2.5, 2.4, 2.3, 2.2],
            "grad_norm/layer0/kda": [0.0 if j else 0.5, 0.4, 0.3, 0.2],
            "grad_norm/layer1/full_attention": [1.0, 0.9, 0.8, 0.7],
            "grad_norm/full_attention": [1.0, 0.9, 0.8, 0.7], "grad_norm/kda": [0.0 if j else 0.5, 0.4, 0.3, 0.2],
            "eval/acc/gap8": [None, 0.2, None, 0.4 + 0.1 * j], "eval/seq_acc/gap8": [None, 0.0, None, 0.1],
            "eval/acc/gap32": [None, 0.1, None, 0.2 + 0.1 * j]})
    return plot_tables.concat_runs(frames)


def _retrieval_score():
    return pl.DataFrame([dict(arm=a, step=int(f * 10), fraction=f, long_gap_fraction=0.0, layer=l,
                              layer_type=["kda", "full_attention"][l % 2], gap=g, score=0.1 * l + f, n=4,
                              margin_clean=1.0, margin_patched=0.5, margin_b=-1.0)
                         for a in ("baseline", "freeze0-0.2") for f in (0.5, 1.0) for l in range(4) for g in (8, 32)])


def _bld_nl_runs():
    frames = {arm: pl.DataFrame({"step": [2, 4, 6], "tokens": [100, 200, 300], "loss": [6.3, 6.2, 6.1 - 0.1 * j],
                                 "lr": [1e-3] * 3, "eval/ce": [None, 6.2, 6.0 - 0.1 * j]})
              for j, arm in enumerate(["gdn-baseline", "gdn-bld", "kda-baseline", "kda-bld"])}
    return plot_tables.concat_runs(frames)


def _position_loss():
    return pl.DataFrame([dict(model=f"{m}-{v}", mixer=m, size="xs", variant=v, bucket_lo=lo, bucket_hi=2 * lo,
                              n_tokens=6 * lo, mean_loss=6.0 - 0.01 * lo)
                         for m in ("gdn", "kda") for v in ("baseline", "bld") for lo in (1, 2, 4, 8)])


def _heads():
    alphas = pl.DataFrame([dict(model=f"gdn-{v}", mixer="gdn", size="xs", variant=v, layer=0, kv_head=h,
                                alpha=0.2 * h + (0.1 if v == "bld" else 0.0)) for v in ("baseline", "bld")
                           for h in range(4)])
    curve = pl.DataFrame([dict(model=f"gdn-{v}", mixer="gdn", size="xs", variant=v, n_masked=k, frac_masked=k / 4,
                               masked_layer=0, masked_kv_head=k, masked_alpha=0.2 * k, accuracy=1.0 - 0.25 * k,
                               token_accuracy=1.0, answer_nll=0.1) for v in ("baseline", "bld") for k in range(5)])
    return alphas, curve


def _position_summary():
    return pl.DataFrame([dict(model=f"{m}-{v}", mixer=m, size="xs", variant=v, n_docs=2, doc_len=64, n_tokens=126,
                              ppl=100.0 + j, n_key_tokens=3, long_ppl=50.0 + j, short_window=8, threshold=2.0,
                              evaluator="kda-baseline")
                         for m in ("gdn", "kda") for j, v in enumerate(("baseline", "bld"))])


def _perplexity():
    rows = [dict(model="teacher", teacher="teacher", placement=None, mixer=None, lang=l, n_tokens=10, ce=1.0,
                 ppl=10.0, kl=None) for l in ("hin_Deva", "rus_Cyrl", "all")]
    kls = {"standard_periodic": (0.4, 0.2, 0.3), "sandwich": (0.1, 0.18, 0.2), "endpoint_spread": (0.2, 0.15, 0.25)}
    for p, ks in kls.items():
        rows += [dict(model=f"teacher/{p}-gdn", teacher="teacher", placement=p, mixer="gdn", lang=l, n_tokens=10,
                      ce=1.0, ppl=10.0 + k, kl=k) for l, k in zip(("hin_Deva", "rus_Cyrl", "all"), ks)]
    return pl.DataFrame(rows)


def _layer_importance():
    from hybridlab.eval.layer_importance import ROW_SCHEMA, group_scores

    rows = [dict(layer=layer, lang=lang, sid=s, kl_tokens=10, kl_sum=(3.0 if layer == 0 else 1.0) * (1 + s % 3),
                 res_tokens=11, res_sum=1.0 + layer, ref_sum=5.0)
            for layer in range(6) for lang in ("eng_Latn", "fra_Latn", "hin_Deva") for s in range(4)]
    scores = group_scores(pl.DataFrame(rows, schema=ROW_SCHEMA), "eng_Latn", 2, n_boot=20)
    return scores.select(pl.lit("teacher").alias("teacher"), pl.lit("gdn").alias("mixer"), pl.all())


def synthetic_tables():
    alphas, curve = _heads()
    return {"softcka": _softcka(), "recency": _recency(), "fertility": _fertility(), "niah": _niah(),
            "distill": _distill_runs(), "tokens_to_baseline": _tokens(), "bld_sr": _bld_sr_runs(),
            "retrieval_score": _retrieval_score(), "bld_nl": _bld_nl_runs(), "position_loss": _position_loss(),
            "retrieval_heads": alphas, "retrieval_heads_masking": curve, "perplexity": _perplexity(),
            "position_loss_summary": _position_summary(), "layer_importance": _layer_importance()}


@pytest.fixture(scope="module")
def tables():
    return synthetic_tables()


@pytest.mark.parametrize("name", sorted(registry.FIGURES))
def test_figure_renders_byte_stable(name, tables, tmp_path):
    paths = []
    for i in range(2):  # two independent renders of the same tables
        fig = registry.render(name, tables)
        paths.append(save_all(fig, tmp_path / f"{i}.png", tmp_path / f"{i}.pdf"))
    (png0, pdf0), (png1, pdf1) = paths
    assert png0.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf0.read_bytes()[:5] == b"%PDF-"
    assert png0.read_bytes() == png1.read_bytes()
    assert pdf0.read_bytes() == pdf1.read_bytes()
    assert b"CreationDate" not in pdf0.read_bytes() and b"matplotlib" not in png0.read_bytes()
    assert len(fig.axes) >= 1 and all(ax.has_data() or ax.patches for ax in fig.axes if ax.get_visible())


def test_svg_stable_and_bad_suffix(tables, tmp_path):
    fig = registry.render("fig_fertility", tables)
    a, b = save_figure(fig, tmp_path / "a.svg"), save_figure(fig, tmp_path / "b.svg")
    assert a.read_bytes() == b.read_bytes() and b"<dc:date>" not in a.read_bytes()
    with pytest.raises(HybridlabError, match=r"\.png, \.pdf or \.svg"):
        save_figure(fig, tmp_path / "a.jpg")


def test_softcka_marks_hybrid_fa_layers(tables):
    fig = figures.softcka_pairs(tables["softcka"], "attn_delta")
    spans = [p for p in fig.axes[0].patches if abs(p.get_alpha() - 0.12) < 1e-9]
    xs = sorted(round(p.get_x() + 0.5) for p in spans)
    assert xs == [1, 3]  # the hybrid's FA decoder layers; dense layers are not shaded
    hidden = figures.softcka_pairs(tables["softcka"], "hidden")
    assert sorted(round(p.get_x() + 0.5) for p in hidden.axes[0].patches if abs(p.get_alpha() - 0.12) < 1e-9) == [2, 4]


def test_niah_annotates_oom(tables):
    fig = figures.niah(tables["niah"])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["OOM"]


def test_placements_rows_from_attn_delta(tables, monkeypatch):
    seen = {}
    monkeypatch.setattr(figures, "draw_placements", lambda ax, rows: seen.update(rows))
    figures.placements(tables["softcka"])
    assert seen == {"teacher": ["full_attention"] * 4, "teacher/sp-gdn": HYB}


def test_perplexity_table_best_and_change(tmp_path):
    rows = [dict(model="teacher", teacher="teacher", placement=None, mixer=None, lang=l, n_tokens=10, ce=1.0,
                 ppl=t, kl=None) for l, t in [("hin_Deva", 10.0), ("all", 12.0)]]
    for p, ppls in [("standard_periodic", (20.0, 30.0)), ("sandwich", (16.0, 33.0)), ("endpoint_spread", (18.0, 31.0))]:
        rows += [dict(model=f"teacher/{p}-gdn", teacher="teacher", placement=p, mixer="gdn", lang=l, n_tokens=10,
                      ce=1.0, ppl=v, kl=0.1) for l, v in zip(("hin_Deva", "all"), ppls)]
    df = plot_tables.perplexity_table(pl.DataFrame(rows))
    assert df["lang"].to_list() == ["hin_Deva", "all"]
    assert df["best_placement"].to_list() == ["sandwich", "standard_periodic"]
    assert df["best_vs_baseline"].to_list() == pytest.approx([16 / 20 - 1, 0.0])
    assert df["teacher_ppl"].to_list() == [10.0, 12.0]
    assert df.columns[3:7] == ["teacher_ppl", "endpoint_spread", "sandwich", "standard_periodic"]
    plot_tables.write_table(df, tmp_path / "t.csv", tmp_path / "t.md")
    md = (tmp_path / "t.md").read_text().splitlines()
    assert md[0].startswith("| teacher") and set(md[1]) <= set("|-: ") and len(md) == 4
    assert "| -0.2 " in md[2] or "| -0.2" in md[2]
    assert pl.read_csv(tmp_path / "t.csv")["best_ppl"].to_list() == [16.0, 30.0]
    with pytest.raises(HybridlabError, match="baseline placement 'reverse_periodic'"):
        plot_tables.perplexity_table(pl.DataFrame(rows), baseline="reverse_periodic")


def test_errors_are_one_line(tables):
    with pytest.raises(HybridlabError, match=r"lacks columns \['relative_to_english'\]"):
        figures.fertility(tables["fertility"].drop("relative_to_english"))
    with pytest.raises(HybridlabError, match="has no rows"):
        figures.niah(tables["niah"].head(0))
    with pytest.raises(HybridlabError, match="unknown figure"):
        registry.render("fig_nope", tables)
    with pytest.raises(HybridlabError, match=r"needs tables \['retrieval_heads_masking'\]"):
        registry.render("fig_retrieval_heads", {"retrieval_heads": tables["retrieval_heads"]})


def test_concat_runs_fills_missing_columns(tables):
    df = tables["distill"]
    assert sorted(df["run"].unique().to_list()) == ["teacher/sandwich-gdn", "teacher/standard_periodic-gdn"]
    assert df.filter(pl.col("run") == "teacher/sandwich-gdn")["eval/ce/rus_Cyrl"].null_count() == 3


def test_script_figure_and_table(tables, tmp_path):
    paths = []
    for run, df in tables["bld_sr"].partition_by("run", as_dict=True).items():
        p = tmp_path / f"{run[0]}.parquet"
        df.drop("run").write_parquet(p)
        paths.append(f"bld_sr/{run[0]}={p}")
    cmd = [sys.executable, str(ROOT / "workflow_scripts/make_figure.py"), "--params", "{}", "--fig", "fig_sr_accuracy",
           "--tables", *paths, "--out-png", str(tmp_path / "f.png"), "--out-pdf", str(tmp_path / "f.pdf")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref.png"
    save_figure(figures.sr_accuracy(tables["bld_sr"]), ref)
    assert (tmp_path / "f.png").read_bytes() == ref.read_bytes()
    bad = subprocess.run(cmd[:-4] + ["--tables", f"softcka={tmp_path / 'missing.parquet'}", "--out-png", "x.png",
                                     "--out-pdf", "x.pdf"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "does not exist" in bad.stderr


def test_every_figure_and_table_has_a_caption():
    assert set(registry.CAPTIONS) == set(registry.FIGURES) | set(registry.TABLES)
    assert all(len(c) > 40 for c in registry.CAPTIONS.values())


def test_softcka_first_fa_change_hybrid_and_dense():
    # synthetic: cka = 0.9 - 0.1 * layer - 0.05 * lang_index; the hybrid's first FA decoder layer is layer 1,
    # i.e. hidden row 2; the change from row 1 to row 2 is -0.1 for both roles and languages.
    # the alignment (the headline columns) rises by 0.2 at hidden row 2 for the hybrid, 0.05 for the dense model
    jump = pl.when((pl.col("layer") >= 2) & (pl.col("role") == "hybrid")).then(0.2).otherwise(0.0)
    soft = _softcka().with_columns(alignment=0.3 + 0.05 * (pl.col("layer") >= 2).cast(pl.Float64) * (
        pl.col("role") == "dense").cast(pl.Float64) + jump)
    df = plot_tables.softcka_first_fa_table(soft)
    assert df.height == 4 and set(df["first_fa_layer"]) == {2}
    assert sorted(df["role"].unique()) == ["dense", "hybrid"]
    assert df.columns.index("alignment_change") < df.columns.index("cka_before")
    row = df.filter((pl.col("role") == "hybrid") & (pl.col("lang") == "rus_Cyrl")).row(0, named=True)
    assert row["cka_before"] == pytest.approx(0.75) and row["cka_after"] == pytest.approx(0.65)
    assert (row["alignment_before"], row["alignment_after"]) == pytest.approx((0.3, 0.5))
    assert df["cka_change"].to_list() == pytest.approx([-0.1] * 4)
    assert df["alignment_change"].to_list() == pytest.approx([0.05, 0.05, 0.2, 0.2])  # dense, dense, hybrid, hybrid
    dense_only = _softcka().filter(pl.col("role") == "dense")
    with pytest.raises(HybridlabError, match="no hybrid with a full-attention layer"):
        plot_tables.softcka_first_fa_table(dense_only)


def test_kl_reduction_ranks_languages():
    df = plot_tables.kl_reduction_table(_perplexity())
    # hin: best sandwich 0.1 vs 0.4 -> 0.75; rus: best endpoint_spread 0.15 vs 0.2 -> 0.25; "all" left out
    assert df["lang"].to_list() == ["hin_Deva", "rus_Cyrl"]
    assert df["best_placement"].to_list() == ["sandwich", "endpoint_spread"]
    assert df["kl_reduction"].to_list() == pytest.approx([0.75, 0.25])
    with pytest.raises(HybridlabError, match="baseline placement 'reverse_periodic'"):
        plot_tables.kl_reduction_table(_perplexity(), baseline="reverse_periodic")


def test_bld_nl_table_joins_runs_and_summary():
    df = plot_tables.bld_nl_table(_bld_nl_runs(), _position_summary())
    assert df.select("mixer", "variant").rows() == [("gdn", "baseline"), ("gdn", "bld"), ("kda", "baseline"),
                                                    ("kda", "bld")]
    # final eval/ce = 6.0 - 0.1 * j for the arm's index j (gdn-baseline 0, gdn-bld 1, kda-baseline 2, kda-bld 3)
    assert df["final_eval_ce"].to_list() == pytest.approx([6.0, 5.9, 5.8, 5.7])
    assert df["ce_vs_baseline"].to_list() == pytest.approx([0.0, -0.1, 0.0, -0.1])
    assert df["long_ppl"].to_list() == [50.0, 51.0, 50.0, 51.0]
    assert df["evaluator"].to_list() == ["kda-baseline"] * 4


def test_sr_longgap_uses_the_last_eval_of_each_sweep_arm(tables):
    d = figures.sr_longgap_final(tables["bld_sr"])
    # sweep arms longgap0.25 (index j=2) and longgap0.75 (j=3); last eval/acc/gap8 = 0.4 + 0.1 j, gap32 = 0.2 + 0.1 j
    assert d.select("gap", "long_gap_fraction").rows() == [(8, 0.25), (8, 0.75), (32, 0.25), (32, 0.75)]
    assert d["value"].to_list() == pytest.approx([0.6, 0.7, 0.4, 0.5])
    with pytest.raises(HybridlabError, match="no long-gap sweep arms"):
        figures.sr_longgap_final(tables["bld_sr"].filter(pl.col("run") == "baseline"))


def test_lm_benchmarks_table_is_wide_and_prefers_filter_none():
    rows = [dict(model="m1", task="arc_easy", metric="acc", filter="none", value=0.5, stderr=0.01),
            dict(model="m1", task="arc_easy", metric="acc_norm", filter="none", value=0.6, stderr=0.01),
            dict(model="m1", task="gsm", metric="exact_match", filter="strict", value=0.1, stderr=0.01),
            dict(model="m1", task="gsm", metric="exact_match", filter="flexible", value=0.2, stderr=0.01),
            dict(model="m0", task="arc_easy", metric="acc", filter="none", value=0.4, stderr=0.01),
            dict(model="m0", task="arc_easy", metric="acc", filter="other", value=0.9, stderr=0.01)]
    df = plot_tables.lm_benchmarks_table(pl.DataFrame(rows))
    values = ["model", "arc_easy/acc", "arc_easy/acc_norm", "gsm/exact_match"]
    assert df.columns == ["model"] + [f"{c}{s}" for c in values[1:] for s in ("", "_lo", "_hi")]
    assert df["model"].to_list() == ["m0", "m1"]
    assert df.select(values).row(0) == ("m0", 0.4, None, None)
    assert df.select(values).row(1) == ("m1", 0.5, 0.6, 0.2)  # no `none` filter: the first filter alphabetically
    # value -+ 1.96 stderr (lm-eval's normal-approximation interval)
    assert (df["arc_easy/acc_lo"][1], df["arc_easy/acc_hi"][1]) == pytest.approx((0.5 - 0.0196, 0.5 + 0.0196))


def test_draw_placements_one_cell_per_layer():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hybridlab.models.placements import PLACEMENTS, layer_types

    fig, ax = plt.subplots()
    rows = {s: layer_types(s, 12, 0.25) for s in PLACEMENTS}
    figures.draw_placements(ax, rows)
    assert len(ax.patches) == 12 * len(PLACEMENTS)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(PLACEMENTS)
    # the FA cells of the top row (standard_periodic) sit at x = 3, 7, 11
    top = len(PLACEMENTS) - 1 + 0.1
    fa_color = ax.patches[3].get_facecolor()
    fa_x = sorted(p.get_x() for p in ax.patches if p.get_y() == top and p.get_facecolor() == fa_color)
    assert fa_x == [3, 7, 11]
    plt.close(fig)
    with pytest.raises(HybridlabError):
        figures.draw_placements(ax, {})
