"""BLD on natural language end to end at `smoke`: every arm trains, retrieval heads and position loss tables."""

import json

import polars as pl
import pytest
import torch
from smoke import build

pytestmark = pytest.mark.smoke_dag  # built in the session's smoke repository (tests/conftest.py)

ARMS = [f"{m}-{v}" for m in ("kda", "gdn") for v in ("baseline", "bld")]  # the smoke preset's mixers


@pytest.mark.slow
def test_bld_nl_arms_and_their_evals_at_smoke(smoke_workdir):
    work = smoke_workdir
    build(work, "results/eval/smoke/retrieval_heads.parquet", "results/eval/smoke/position_loss.parquet")
    train = work / "results/train/smoke/bld_nl/seed0"
    assert sorted(d.name for d in train.iterdir()) == sorted(ARMS)

    from hybridlab.models.registry import load_causal_lm
    from hybridlab.train.bld_nl import is_nope

    for arm in ARMS:
        summary = json.loads((train / arm / "summary.json").read_text())
        assert summary["steps"] == 12 and summary["optimizer_switch_step"] == 1  # F = round(12 * 0.1 / 1.1)
        assert summary["freeze_windows"] == ([[0, 1]] if arm.endswith("-bld") else [])
        metrics = pl.read_parquet(train / arm / "metrics.parquet")
        assert metrics["loss"][-1] < metrics["loss"][0]
        assert {"grad_norm/full_attention", "eval/ce"} <= set(metrics.columns)
    model = load_causal_lm(train / "kda-bld")
    assert is_nope(model) and model.hybridlab_spec.layer_types == ["full_attention", "kda", "kda", "kda"]
    # baseline and BLD start from the same initialisation and differ after training
    b, f = (load_causal_lm(train / a).state_dict() for a in ("kda-baseline", "kda-bld"))
    assert any(not torch.equal(b[k], f[k]) for k in b)

    alphas = pl.read_parquet(work / "results/eval/smoke/retrieval_heads.parquet")
    # one full-attention layer with 2 KV heads per arm
    assert alphas.height == len(ARMS) * 2 and set(alphas["model"]) == set(ARMS)
    assert alphas["alpha"].is_between(0, 1).all() and set(alphas["layer"]) == {0}
    curve = pl.read_parquet(work / "results/eval/smoke/retrieval_heads_masking.parquet")
    assert curve.group_by("model").len()["len"].to_list() == [3] * len(ARMS)  # k = 0, 1, 2 masked heads
    assert curve["accuracy"].is_between(0, 1).all() and curve["answer_nll"].is_finite().all()

    buckets = pl.read_parquet(work / "results/eval/smoke/position_loss.parquet")
    assert set(buckets["model"]) == set(ARMS)
    assert buckets.filter(pl.col("model") == "kda-bld")["bucket_lo"].to_list() == [1, 2, 4, 8, 16, 32]
    summary = pl.read_parquet(work / "results/eval/smoke/position_loss_summary.parquet")
    assert summary.height == len(ARMS) and (summary["ppl"] > 1).all()
    assert (summary["n_tokens"] == 6 * 63).all()  # 6 documents of 64 tokens
