"""Smoke jobs through a real single-node SLURM (tests/workflow/slurm/start.sh) with the project's SLURM
profile: every job goes through sbatch, and the outputs equal those of a local build. And the multi-node
launch (hybridlab.pipeline.cluster.launch.srun_prefix: srun + torchrun with a c10d rendezvous) in one allocation of two
CPU tasks. Both tests share the one cluster (one file, so pytest-xdist runs them on one worker).

Skipped, with start.sh's reason, where that cluster cannot run (not root, no apt-get, no package
registry). Daemons this session started are stopped at its end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from hybridlab import cache
from hybridlab.pipeline.cluster.launch import srun_prefix

from smoke import ROOT, SCALE, built_repo, file_hashes, git, pipeline_env, snakemake

# What runs on SLURM: two jobs, a CPU data script (Spaced Retrieval, no inputs) and a torch training
# job (teacher pre-training). The teacher's inputs (corpus, tokenizer, mixtures) are copied from the
# local build into the clone, mtimes kept, so Snakemake schedules exactly these two jobs: every job
# goes through the same sbatch/srun path, so more job kinds add time (about 20 s of SLURM and Snakemake
# start-up each on 2 cores), not coverage.
TARGETS = ["results/data/smoke/spaced_retrieval/train.parquet",
           "results/models/smoke/teachers/teacher/model.safetensors"]
SLURM_JOBS = {"spaced_retrieval": 1, "teacher": 1}
# Local outputs copied into the clone: the data phase but what spaced_retrieval writes.
COPIED = ("corpus", "tokenizer", "mixture")
# What the SLURM jobs write (compared file by file with the local build).
SLURM_OUTPUTS = ("data/smoke/spaced_retrieval", "models/smoke/teachers/teacher")
# Run logs and timings differ between any two runs; everything else must match byte for byte,
# except wall-clock columns of metrics tables.
VOLATILE_DIRS = ("logs", "benchmarks")
WALL_CLOCK = re.compile(r"per_s|_time|seconds|elapsed")

pytest.importorskip("snakemake_executor_plugin_slurm", reason="needs `pip install -e '.[slurm]'`")
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.smoke_dag]


@pytest.fixture(scope="session")
def slurm_cluster():
    """KEY=VALUE facts printed by start.sh (SLURM_CONF, SLURM_PARTITION, SLURM_STARTED)."""
    proc = subprocess.run(["bash", str(ROOT / "tests/workflow/slurm/start.sh")], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode == 77:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, f"tests/workflow/slurm/start.sh failed:\n{proc.stdout}\n{proc.stderr}"
    info = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    yield info
    if info.get("SLURM_STARTED") == "1":
        subprocess.run(["bash", str(ROOT / "tests/workflow/slurm/stop.sh")], capture_output=True, text=True, timeout=120)


def _rule_names(workdir: Path, env: dict) -> list[str]:
    out = snakemake(workdir, "--list-rules", "--config", f"scale={SCALE}", env=env).stdout
    return [m.group(1) for line in out.splitlines() if (m := re.match(r"^([A-Za-z_]\w*)(\s|$)", line))]


def _jobcomp(path: Path, run_id: str) -> dict[str, dict[str, str]]:
    """Job id -> fields of the jobcomp/filetxt records of one Snakemake run (job name = run id)."""
    jobs = {}
    for line in path.read_text().splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if fields.get("Name") == run_id:
            jobs[fields["JobId"]] = fields
    return jobs


def _same_dcp_metadata(a: Path, b: Path) -> bool:
    """DCP checkpoint metadata: equal up to its per-save random id and temp path (storage_meta)."""
    import pickle

    ma, mb = (pickle.loads(p.read_bytes()) for p in (a, b))
    return ma.state_dict_metadata == mb.state_dict_metadata and ma.planner_data == mb.planner_data


def _same_table(a: Path, b: Path) -> bool:
    fa, fb = pl.read_parquet(a), pl.read_parquet(b)
    keep = [c for c in fa.columns if not WALL_CLOCK.search(c)]
    return fa.columns == fb.columns and fa.select(keep).equals(fb.select(keep))


def test_smoke_targets_run_through_sbatch_and_match_a_local_build(slurm_cluster, tmp_path_factory, smoke_workdir):
    local = built_repo(smoke_workdir, TARGETS)
    # A clone of the locally built commit: same files, same git commit in the provenance records.
    work = tmp_path_factory.mktemp("slurm-run") / "repo"
    git(local.parent, "clone", "-q", str(local), str(work))
    for name in COPIED:
        shutil.copytree(local / "results/data" / SCALE / name, work / "results/data" / SCALE / name,
                        symlinks=True)  # copy2: mtimes kept, so Snakemake sees them up to date
    env = pipeline_env(SLURM_CONF=slurm_cluster["SLURM_CONF"],
                       # The profile reads the partition from the environment.
                       SNAKEMAKE_SLURM_PARTITION=slurm_cluster["SLURM_PARTITION"])
    for key in ("SNAKEMAKE_SLURM_ACCOUNT", "SNAKEMAKE_SLURM_PARTITIONS", "SLURM_JOB_ID"):
        env.pop(key, None)
    dry = snakemake(work, "-n", *TARGETS, "--config", f"scale={SCALE}", env=env)
    expected = cache.parse_job_stats(dry.stdout + dry.stderr)
    # Phase targets only collect inputs: Snakemake runs them itself, not through sbatch.
    expected = {rule: n for rule, n in expected.items() if rule not in cache.PHASES and rule != "all"}
    assert expected == SLURM_JOBS, f"the copied inputs should leave exactly {SLURM_JOBS}: {dry.stdout[-3000:]}"

    # 2 cores here: every job asks for 1 CPU and little memory instead of the profile's cluster sizes.
    small = [f"{r}:{k}={v}" for r in _rule_names(work, env)
             for k, v in (("cpus_per_task", 1), ("mem_mb", 512), ("runtime", 20))]
    proc = snakemake(work, *TARGETS, "--workflow-profile", "profiles/slurm", "--executor", "slurm",
                     "--config", f"scale={SCALE}", "--jobs", "2", "--cores", "2", "--retries", "0",
                     "--latency-wait", "10",
                     # No slurmdbd, so no sacct: squeue sees finished jobs for MinJobAge (1 h).
                     "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
                     "--slurm-keep-successful-logs", "--set-resources", *small, env=env, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]

    # Every job went through sbatch: SLURM recorded each one, completed, in the partition the
    # profile took from the environment, and the plugin kept one SLURM log per job and rule.
    run_id = re.search(r"SLURM run ID: (\S+)", log).group(1)
    state = Path(slurm_cluster["SLURM_CONF"]).parent
    jobs = _jobcomp(state / "log" / "jobcomp.txt", run_id)
    assert jobs and {f["JobState"] for f in jobs.values()} == {"COMPLETED"}, jobs
    assert {f["Partition"] for f in jobs.values()} == {slurm_cluster["SLURM_PARTITION"]}
    slurm_logs = {p.stem: p.relative_to(work / ".snakemake/slurm_logs").parts[0]
                  for p in (work / ".snakemake/slurm_logs").rglob("*.log")}
    assert set(slurm_logs) == set(jobs)
    assert Counter(rule.removeprefix("rule_") for rule in slurm_logs.values()) == Counter(expected)

    # Same outputs as the local build, for what the SLURM jobs wrote.
    for out in SLURM_OUTPUTS:
        ours = file_hashes(work / "results" / out, VOLATILE_DIRS)
        theirs = file_hashes(local / "results" / out, VOLATILE_DIRS)
        assert ours and set(ours) == set(theirs), f"{out}: files in one build only {set(ours) ^ set(theirs)}"
        differ = [rel for rel in ours if ours[rel] != theirs[rel]]
        rel_root = Path("results") / out
        for rel in differ:
            a, b = work / rel_root / rel, local / rel_root / rel
            same = (_same_table(a, b) if rel.endswith(".parquet")
                    else _same_dcp_metadata(a, b) if Path(rel).name == ".metadata" else False)
            assert same, f"{rel_root / rel} differs between the SLURM and the local build"


LAUNCH_WORKER = """
import json, os, socket, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
out = {"rank": rank, "world": world, "sum": t.item(), "group_rank": int(os.environ["GROUP_RANK"]),
       "local_rank": int(os.environ["LOCAL_RANK"]), "host": socket.gethostname()}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_srun_torchrun_c10d_launch_runs_two_agents_as_one_world(slurm_cluster, tmp_path):
    """Two SLURM tasks, one torchrun agent each (as over two nodes), meet at the rendezvous on the
    allocation's first host and all-reduce as one world of two. The job runs the launch as snakemake's
    jobstep runs a rule's command: with every SLURM_* variable but SLURM_JOB_ID removed."""
    (tmp_path / "worker.py").write_text(LAUNCH_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    prefix = srun_prefix(2, 1, port=_free_port(), agents_per_node=2, python=sys.executable)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        'for v in $(compgen -e | grep "^SLURM_" | grep -vx SLURM_JOB_ID); do unset "$v"; done\n'
        f"cd {tmp_path}\n{prefix} worker.py {out}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(SLURM_CONF=slurm_cluster["SLURM_CONF"], PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    log = tmp_path / "job.log"
    proc = subprocess.run(["sbatch", "--wait", "--nodes=1", "--ntasks=2", "--cpus-per-task=1", "--mem=1000",
                           "-t", "5", "-p", slurm_cluster["SLURM_PARTITION"], "-o", str(log), str(script)],
                          capture_output=True, text=True, timeout=300, env=env)
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{text[-4000:]}"
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1], text[-4000:]
    assert {r["world"] for r in ranks} == {2} and {r["sum"] for r in ranks} == {3.0}
    assert sorted(r["group_rank"] for r in ranks) == [0, 1] and {r["local_rank"] for r in ranks} == {0}
