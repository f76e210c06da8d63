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


def gpus(n_paper):
    """GPUs a rule asks for: n at the paper preset, none on the CPU presets."""
    return n_paper if ON_GPU else 0


CPU_ENV = "../envs/cpu.yaml"
CUDA_ENV = "../envs/cuda.yaml" if ON_GPU else "../envs/cpu.yaml"
NOT_READY = f"{PY} workflow_scripts/not_ready.py"


def launcher(n_gpu):
    """How a training script starts: plain python on CPU or one GPU, torchrun for several GPUs."""
    return PY if n_gpu <= 1 else f"torchrun --standalone --nproc_per_node {n_gpu}"


# On CPU each training job gets one thread and Snakemake runs jobs side by side: measured on 2 cores,
# small models gain little from a second thread and two threaded jobs fight for the CPUs. GPU jobs
# (paper preset) get 8 CPU threads for data loading and the optimizer.
TRAIN_THREADS = 8 if ON_GPU else 1
