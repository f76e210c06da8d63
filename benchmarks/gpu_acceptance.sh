#!/usr/bin/env bash
# GPU acceptance: one command, at most 6 minutes on one GPU, no network;
# ends with one JSON line on stdout (also written to --out FILE). On a CPU machine: --dry-run.
#   bash benchmarks/gpu_acceptance.sh [--dry-run] [--out FILE] [--peak-tflops X] [--only STAGE ...]
# Python: $PYTHON if set, else the project's .venv, else python3. See docs/cluster.md, "GPU acceptance".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
# Triton keeps autotuning results next to the compiled kernels: the warm-up stage pays both, once
export TRITON_CACHE_AUTOTUNING="${TRITON_CACHE_AUTOTUNING:-1}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" benchmarks/gpu_acceptance.py "$@"
