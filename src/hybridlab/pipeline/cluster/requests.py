"""What each rule asks the cluster for: GPUs, host memory, disk, time, nodes, threads and its launch line.

rules/common.smk builds one `Requests` per preset; the rules call `gpus`, `job_resources` and `launcher`. At the
paper preset every job's estimated peak per GPU is checked against the GPU memory (HYBRIDLAB_GPU_MEM_GB, default
80) before anything is submitted (`plan`, also `hybridlab plan`); host memory, disk, time limit and node placement
come from `resources` (derived from the model shapes, budgets and document counts at the paper preset, fixed
allowances elsewhere). presets.<scale>.cluster gives the GPUs per node; a job needing more is refused unless
multi_node is set.
"""

from __future__ import annotations

import os

from hybridlab.pipeline.cluster.launch import launch_prefix, srun_prefix
from hybridlab.pipeline.cluster.resources import cluster_settings, placement, rule_resources

# CPU processes (gloo) a multi-GPU rule gets at the rehearsal preset
REHEARSAL_PROCESSES = 2


class Requests:
    """The cluster requests of one preset (`raw`: Snakemake's config; `C`: its resolved view)."""

    def __init__(self, raw: dict, C: dict):
        self.scale = C["scale"]
        self.on_gpu = self.scale == "paper"
        self.gpu_mem_gb = float(os.environ.get("HYBRIDLAB_GPU_MEM_GB", "80"))
        self.memory_plan = []
        if self.on_gpu:  # the plan imports torch: only where it is needed
            from hybridlab.pipeline.cluster.plan import plan_preset, refuse_unfit

            self.memory_plan = plan_preset(raw, gpu_mem_gb=self.gpu_mem_gb)
            refuse_unfit(self.memory_plan, self.gpu_mem_gb)
        self.resources = rule_resources(raw, self.memory_plan if self.on_gpu else None)
        self.cluster = cluster_settings(C)
        self.cpu_env = "../envs/cpu.yaml"
        self.cuda_env = "../envs/cuda.yaml" if self.on_gpu else "../envs/cpu.yaml"
        # On CPU each training job gets one thread and Snakemake runs jobs side by side: measured on 2 cores,
        # small models gain little from a second thread and two threaded jobs fight for the CPUs. GPU jobs
        # (paper preset) get 8 CPU threads for data loading and the optimizer.
        self.train_threads = 8 if self.on_gpu else 1

    def gpus(self, job, at_least=1):
        """GPUs a rule asks for at the paper preset (none on the CPU presets).

        `job` is a plan job-name prefix (e.g. "distill_stage2"): the request is the smallest GPU count the plan
        fits it in, but at least `at_least` (the count the preset's batch settings assume); an int is a fixed
        count.
        """
        if not self.on_gpu:
            return 0
        if isinstance(job, int):
            return job
        from hybridlab.pipeline.cluster.plan import gpus_for

        return max(at_least, gpus_for(self.memory_plan, job, self.gpu_mem_gb))

    def job_resources(self, rule, n_gpu=0, model=None):
        """The resources of `rule`'s jobs - mem_mb, disk_mb, runtime, gpu and one node (`nodes=1`, so SLURM never
        spreads a multi-GPU job over nodes). A job needing more GPUs than a node has runs on whole nodes when
        cluster.multi_node is set: per-node GPUs as gres, one srun task per node (`mpi`: the jobstep runs the
        rule's command itself, whose launcher calls srun), memory per node. `model(wildcards)` names the
        published model one job loads, or None for a model of the DAG; it sizes that job's mem_mb."""
        r = self.resources[rule]
        out = {"mem_mb": r.mem_mb, "disk_mb": r.disk_mb, "runtime": r.runtime, "gpu": n_gpu, "nodes": 1}
        if model is not None and r.by_model:
            out["mem_mb"] = lambda wc: r.mem_mb_for(model(wc))
        place = placement(rule, n_gpu, self.cluster, self.scale)
        if place.nodes > 1:
            out.update(
                mem_mb=-(-r.mem_mb // place.nodes),
                gpu=0,
                gres=f"gpu:{place.gpus_per_node}",
                nodes=place.nodes,
                tasks=place.nodes,
                tasks_per_gpu=0,
                mpi="srun",
            )
        return out

    def launcher(self, n_gpu, at_least=1, rule=None):
        """How a training script starts: plain python on CPU or one GPU, torchrun for several (FSDP2), and
        srun + torchrun (c10d rendezvous) over whole nodes for a job larger than a node (cluster.multi_node).

        At the rehearsal preset a rule that runs on several GPUs at paper (`at_least` > 1) runs on
        REHEARSAL_PROCESSES CPU processes, so the multi-process path is exercised without a GPU.
        """
        n = REHEARSAL_PROCESSES if self.scale == "rehearsal" and at_least > 1 else max(1, n_gpu)
        place = placement(rule or "a training job", n_gpu, self.cluster, self.scale) if self.on_gpu else None
        if place is not None and place.nodes > 1:
            return srun_prefix(place.nodes, place.gpus_per_node, port=self.cluster["rdzv_port"])
        return launch_prefix(n)
