"""BLD on Spaced Retrieval and the retrieval-score table end to end through Snakemake at `smoke`."""

import json

import polars as pl
import pytest
import yaml
from smoke import build, run_snakemake

from hybridlab.config import resolve
from hybridlab.train.arms import sr_arm_specs, sr_arm_windows, sr_score_points
from hybridlab.train.spaced_retrieval import score_steps

pytestmark = pytest.mark.smoke_dag  # built in the session's smoke repository (tests/conftest.py)


@pytest.mark.slow
def test_bld_sr_arms_and_retrieval_score_at_smoke(smoke_workdir):
    work = smoke_workdir
    raw = yaml.safe_load((work / "config.yaml").read_text())
    raw["scale"] = "smoke"
    C = resolve(raw)
    exp, run = C["experiments"]["bld_sr"], C["train"]["bld_sr"]
    build(work, "results/eval/smoke/retrieval_score.parquet")

    root = work / "results/train/smoke/bld_sr/seed0"
    arms = sorted(p.name for p in root.iterdir() if p.is_dir())
    expected = list(sr_arm_specs(exp))
    assert arms == sorted(expected) and len(expected) == 4  # one arm of each kind (config.yaml, smoke)
    steps = run["steps"]
    fractions, updates = sr_score_points(exp)
    ckpt_steps = score_steps(fractions, steps, updates)
    for arm in arms:
        d = root / arm
        for f in ("config.json", "model.safetensors", "hybrid.json", "metrics.parquet", "summary.json"):
            assert (d / f).is_file(), f"{arm}: {f} missing"
        spec = json.loads((d / "hybrid.json").read_text())
        assert spec["layer_types"] == ["kda", "full_attention", "kda", "full_attention"]
        index = json.loads((d / "score_checkpoints/index.json").read_text())
        assert [c["step"] for c in index["checkpoints"]] == ckpt_steps
        assert all((d / c["path"] / "model.safetensors").is_file() for c in index["checkpoints"])
        m = pl.read_parquet(d / "metrics.parquet")
        assert m["step"].to_list() == list(range(1, steps + 1))  # logged every update
        for col in ("acc/gap8", "acc/gap32", "grad_norm/kda", "grad_norm/full_attention",
                    "grad_norm/layer0/kda", "grad_norm/layer3/full_attention", "eval/acc/gap8"):
            assert col in m.columns, f"{arm}: {col}"
        summary = json.loads((d / "summary.json").read_text())
        assert set(summary["test"]) == {"acc/gap8", "acc/gap32", "seq_acc/gap8", "seq_acc/gap32"}

    # Freezing: the recurrent blocks get no gradient exactly during the window, attention always does; every
    # arm saves a score checkpoint at the end of every window (the model after its last frozen update).
    windows = {a: sr_arm_windows(a, steps) for a in expected if sr_arm_windows(a, steps)}
    assert len(windows) == 2 and any(a.endswith("u") for a in windows)  # a fraction arm and an update arm
    for arm, [(start, end)] in windows.items():
        assert end in ckpt_steps
        m = pl.read_parquet(root / arm / "metrics.parquet")
        kda = m["grad_norm/kda"].to_list()
        frozen = [i for i, v in enumerate(kda) if v == 0.0]  # update index = step - 1
        assert frozen == list(range(start, end)), (arm, kda)
        assert [i for i, f in enumerate(m["frozen"].to_list()) if f] == frozen
        assert min(m["grad_norm/full_attention"].to_list()) > 0
    assert min(pl.read_parquet(root / "baseline" / "metrics.parquet")["grad_norm/kda"].to_list()) > 0

    # Long-gap sweep: the trained mix follows the arm's fraction (sampled without replacement from it).
    for f in exp["long_gap_fractions"]:
        m = pl.read_parquet(root / f"longgap{f:g}" / "metrics.parquet")
        share = m["sr/seqs/gap32"].sum() / (m["sr/seqs/gap32"].sum() + m["sr/seqs/gap8"].sum())
        assert abs(share - f) < 0.15, (f, share)

    table = pl.read_parquet(work / "results/eval/smoke/retrieval_score.parquet")
    assert table.columns[:5] == ["arm", "seed", "step", "fraction", "long_gap_fraction"]
    assert table["seed"].unique().to_list() == [0]
    assert {"layer", "layer_type", "gap", "score", "n", "margin_clean", "margin_patched", "margin_b"} <= set(table.columns)
    assert table.height == len(arms) * len(ckpt_steps) * 4 * 2
    assert set(table["arm"]) == set(arms) and set(table["gap"]) == {8, 32}
    types = table.filter((pl.col("arm") == "baseline") & (pl.col("step") == steps)).sort(["gap", "layer"])
    assert types["layer_type"].to_list()[:4] == ["kda", "full_attention", "kda", "full_attention"]
    assert (table["n"] == C["eval"]["retrieval_score"]["max_examples_per_gap"]).all()

    again = run_snakemake(work, "-n", "results/eval/smoke/retrieval_score.parquet", "--config", "scale=smoke")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
