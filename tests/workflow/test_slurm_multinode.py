"""The multi-node launch (hybridlab.train.launch.srun_prefix: srun + torchrun, c10d rendezvous) on the local
SLURM (tests/workflow/slurm/start.sh): one sbatch allocation of two CPU tasks, one torchrun agent each,
meeting at the rendezvous on the allocation's first host and all-reducing over gloo.

The job runs the launch the way snakemake's SLURM jobstep runs a rule's command: with every SLURM_*
variable but SLURM_JOB_ID removed. Skipped, with start.sh's reason, where that cluster cannot run (not
root, no apt-get, no package registry).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from smoke import ROOT

from hybridlab.train.launch import srun_prefix

pytestmark = [pytest.mark.slurm]

WORKER = """
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


@pytest.fixture(scope="module")
def slurm():
    proc = subprocess.run(["bash", str(ROOT / "tests/workflow/slurm/start.sh")], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode == 77:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, f"tests/workflow/slurm/start.sh failed:\n{proc.stdout}\n{proc.stderr}"
    info = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    yield info
    if info.get("SLURM_STARTED") == "1":
        subprocess.run(["bash", str(ROOT / "tests/workflow/slurm/stop.sh")], capture_output=True, text=True,
                       timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_srun_torchrun_c10d_launch_runs_two_agents_as_one_world(slurm, tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    prefix = srun_prefix(2, 1, port=_free_port(), agents_per_node=2, python=sys.executable)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        # what snakemake's jobstep does to the environment of a rule's command
        'for v in $(compgen -e | grep "^SLURM_" | grep -vx SLURM_JOB_ID); do unset "$v"; done\n'
        f"cd {tmp_path}\n{prefix} worker.py {out}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(SLURM_CONF=slurm["SLURM_CONF"], PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    log = tmp_path / "job.log"
    proc = subprocess.run(["sbatch", "--wait", "--nodes=1", "--ntasks=2", "--cpus-per-task=1", "--mem=1000",
                           "-t", "5", "-p", slurm["SLURM_PARTITION"], "-o", str(log), str(script)],
                          capture_output=True, text=True, timeout=300, env=env)
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{text[-4000:]}"
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    # two agents (torchrun nodes), one process each: one world of 2 whose all-reduce saw both
    assert [r["rank"] for r in ranks] == [0, 1], text[-4000:]
    assert {r["world"] for r in ranks} == {2} and {r["sum"] for r in ranks} == {3.0}
    assert sorted(r["group_rank"] for r in ranks) == [0, 1] and {r["local_rank"] for r in ranks} == {0}
