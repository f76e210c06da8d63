"""How a training script is started for a given process count (the rules' `launcher`).

One process: plain `python`. More on one node: `python -m torch.distributed.run --standalone
--nproc_per_node N` (torchrun's module form, so it uses the same interpreter and environment as the
rule). Over several nodes (`srun_prefix`, config `presets.<scale>.cluster.multi_node`): `srun` starts one
torchrun agent per node inside the job's SLURM allocation, and the agents meet at a c10d rendezvous on
the allocation's first node. The loop joins the process group from torchrun's environment (gloo on CPU,
nccl on CUDA) and shards with FSDP2, so the same script runs under all three.
"""

from __future__ import annotations

from hybridlab.errors import HybridlabError

# The allocation's first host, read from SLURM itself: snakemake's jobstep executor removes SLURM_* but
# SLURM_JOB_ID from the environment of the command it runs, so SLURM_JOB_NODELIST is not there.
FIRST_HOST = '$(scontrol show hostnames "$(squeue -h -j "$SLURM_JOB_ID" -o %N)" | head -n 1)'


def launch_prefix(nproc: int, python: str = "python") -> str:
    if not isinstance(nproc, int) or nproc < 1:
        raise HybridlabError(f"process count {nproc!r} must be a whole number >= 1")
    if nproc == 1:
        return python
    return f"{python} -m torch.distributed.run --standalone --nproc_per_node {nproc}"


def srun_prefix(agents: int, nproc_per_agent: int, *, port: int = 29500, agents_per_node: int = 1,
                python: str = "python") -> str:
    """`srun` + torchrun over `agents` SLURM tasks (one per node by default), `nproc_per_agent` processes each.

    Runs inside a SLURM allocation of at least `agents` tasks (sbatch --nodes / --ntasks); the rendezvous
    (c10d, id = the SLURM job id, so a requeued job starts a fresh one) listens on `port` of the
    allocation's first host. World size = agents x nproc_per_agent.
    """
    for name, v in (("agents", agents), ("nproc_per_agent", nproc_per_agent), ("agents_per_node", agents_per_node)):
        if not isinstance(v, int) or v < 1:
            raise HybridlabError(f"{name} {v!r} must be a whole number >= 1")
    if not isinstance(port, int) or not 1024 <= port <= 65535:
        raise HybridlabError(f"rendezvous port {port!r} must be a whole number in 1024..65535")
    nodes = -(-agents // agents_per_node)
    return (f"srun --nodes={nodes} --ntasks={agents} --ntasks-per-node={agents_per_node} --kill-on-bad-exit=1 "
            f"{python} -m torch.distributed.run --nnodes={agents} --nproc_per_node={nproc_per_agent} "
            f"--rdzv_backend=c10d --rdzv_endpoint={FIRST_HOST}:{port} --rdzv_id=$SLURM_JOB_ID")
