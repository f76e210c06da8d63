"""data.packing.document_mask through the DAG at `smoke`: teacher, distillation and BLD-NL train masked.

A copy of the session's smoke repository (data phase built) runs one distillation student and one
BLD-NL arm with the option switched on by an extra config file, as a user would.
"""

import shutil

import numpy as np
import polars as pl
import pytest
from smoke import snakemake

pytestmark = pytest.mark.smoke_dag  # built in the session's smoke repository (tests/conftest.py)

OVERRIDE = "presets:\n  smoke:\n    data:\n      packing:\n        document_mask: true\n"
STAGE2 = "results/train/smoke/distill/seed0/teacher/standard_periodic-gdn/stage2/metrics.parquet"
BLD_NL = "results/train/smoke/bld_nl/seed0/kda-bld/metrics.parquet"
TEACHER = "results/models/smoke/teachers/teacher/metrics.parquet"


@pytest.mark.slow
def test_document_mask_reaches_every_training_job_and_unscores_boundaries(smoke_workdir, tmp_path):
    work = tmp_path / "repo"
    shutil.copytree(smoke_workdir, work, symlinks=True)
    (work / "docmask.yaml").write_text(OVERRIDE)
    args = ["--configfile", "docmask.yaml", "--config", "scale=smoke"]
    plan = snakemake(work, STAGE2, BLD_NL, "-n", "-p", "--forceall", *args).stdout
    # teacher, convert (no training: no flag), the shared stage 1, assemble_stage1 (stage 2's settings), stage 2, bld_nl
    assert plan.count('"document_mask": true') == 5, plan[-3000:]
    snakemake(work, STAGE2, BLD_NL, "--cores", "2", *args)

    from hybridlab.data.packing import PackedDataset

    mixture = next((work / "results/data/smoke/mixture").glob("*/multilingual"))
    rows = PackedDataset(mixture, "train")
    boundaries = sum(int((rows.doc_starts(i) > 0).sum()) for i in range(len(rows)))
    teacher = pl.read_parquet(work / TEACHER)
    unmasked = int(teacher["step"][-1]) * 8 * (rows.seq_len - 1)  # smoke teacher: micro_batch 8, no accumulation
    masked = unmasked - int(teacher["tokens"][-1])
    # each document boundary inside a sampled row removes one scored target
    assert 0 < masked <= boundaries * int(np.ceil(unmasked / (len(rows) * (rows.seq_len - 1))))
    for path in (STAGE2, BLD_NL):
        metrics = pl.read_parquet(work / path)
        assert metrics["loss"].is_finite().all() and metrics["eval/ce"].drop_nulls().is_finite().all()
