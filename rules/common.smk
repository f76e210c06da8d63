# Shared helpers for every rule file: validated config, output paths, resources, params.

import json
import os
import sys

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from hybridlab.config import config_hash, resolve, validate
from hybridlab.errors import HybridlabError

try:
    validate(config)
except HybridlabError as _exc:
    # One line, no traceback: Snakemake would otherwise wrap it in a parse-error report.
    print(f"error: {_exc}", file=sys.stderr)
    sys.exit(1)

C = resolve(config)
SCALE = C["scale"]
# Hash of the whole resolved preset: shown in every report caption and recorded with every figure.
CONFIG_HASH = config_hash(C)
DATA = C["data"]
OFFLINE = DATA["source"] == "offline"
ON_GPU = SCALE == "paper"
# The paper preset's code paths (hub data and models, multi-process training, lm-eval). The rehearsal
# preset runs them on CPU at miniature size: only numbers and paths differ.
PAPER_PATH = SCALE in ("paper", "rehearsal")
REHEARSAL_PROCESSES = 2  # CPU processes (gloo) a multi-GPU rule gets at the rehearsal preset
PY = "python"
# Downloaded registry packages (offline corpus) live outside results/ and are reused across presets.
CACHE_DIR = os.environ.get("HYBRIDLAB_CACHE", "cache")


def R(phase, path=""):
    """Output path of a phase at the active scale: results/<phase>/<scale>/<path>."""
    return f"results/{phase}/{SCALE}/{path}".rstrip("/")


def LOG(phase, name):
    return f"results/{phase}/{SCALE}/logs/{name}.log"


def BENCH(phase, name):
    return f"results/{phase}/{SCALE}/benchmarks/{name}.tsv"


def as_json(obj):
    """Rule params as one JSON string; Snakemake reruns a rule when its params change."""
    return json.dumps(obj, sort_keys=True)


# Memory plan (hybridlab.train.plan, `hybridlab plan`): at the paper preset every job's estimated peak per
# GPU is checked here, before anything is submitted; GPU memory from HYBRIDLAB_GPU_MEM_GB (default 80).
GPU_MEM_GB = float(os.environ.get("HYBRIDLAB_GPU_MEM_GB", "80"))


def _memory_plan():
    if not ON_GPU:
        return []
    from hybridlab.train.plan import plan_preset, refuse_unfit

    try:
        plans = plan_preset(config, gpu_mem_gb=GPU_MEM_GB)
        refuse_unfit(plans, GPU_MEM_GB)
    except HybridlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    return plans


MEMORY_PLAN = _memory_plan()


def gpus(job, at_least=1):
    """GPUs a rule asks for at the paper preset (none on the CPU presets).

    `job` is a plan job-name prefix (e.g. "distill_stage2"): the request is the smallest GPU count the plan
    fits it in, but at least `at_least` (the count the preset's batch settings assume); an int is a fixed count.
    """
    if not ON_GPU:
        return 0
    if isinstance(job, int):
        return job
    from hybridlab.train.plan import gpus_for

    return max(at_least, gpus_for(MEMORY_PLAN, job, GPU_MEM_GB))


CPU_ENV = "../envs/cpu.yaml"
CUDA_ENV = "../envs/cuda.yaml" if ON_GPU else "../envs/cpu.yaml"


def launcher(n_gpu, at_least=1):
    """How a training script starts: plain python on CPU or one GPU, torchrun for several (FSDP2).

    At the rehearsal preset a rule that runs on several GPUs at paper (`at_least` > 1) runs on
    REHEARSAL_PROCESSES CPU processes, so the multi-process path is exercised without a GPU.
    """
    from hybridlab.train.launch import launch_prefix

    n = REHEARSAL_PROCESSES if SCALE == "rehearsal" and at_least > 1 else max(1, n_gpu)
    return launch_prefix(n, python=PY)


# On CPU each training job gets one thread and Snakemake runs jobs side by side: measured on 2 cores,
# small models gain little from a second thread and two threaded jobs fight for the CPUs. GPU jobs
# (paper preset) get 8 CPU threads for data loading and the optimizer.
TRAIN_THREADS = 8 if ON_GPU else 1
