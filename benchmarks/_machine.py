"""What machine a benchmark ran on: CPU model, the ISA level torch dispatches to, BLAS/oneDNN, threads.

`describe()` returns a flat dict that every benchmark prints (`describe_line`) and keeps under the key
``machine`` of its JSON line, so figures from different CPUs are never compared blind:

- ``cpu_model``: the ``model name`` of /proc/cpuinfo (``lscpu``'s "Model name" where that is missing);
- ``cpu_id``: vendor, family and model numbers (a virtual machine often shows a bare "AMD EPYC");
- ``cpu_flags``: which of avx2 / fma / avx512f / avx512_bf16 / amx_tile the kernel reports;
- ``cpu_capability``: ``torch.backends.cpu.get_cpu_capability()``, the ISA of torch's own vectorised
  element-wise kernels (``DEFAULT``, ``AVX2``, ``AVX512``; ``ATEN_CPU_CAPABILITY`` can lower it);
- ``blas``: torch's BLAS (``BLAS_INFO`` of ``torch.__config__.show()``) with the MKL / oneDNN versions
  it was built with, and whether ``torch.backends.mkl`` / ``torch.backends.mkldnn`` are available;
  MKL chooses its GEMM kernels by CPU vendor and ISA, so the same wheel takes different paths on
  Intel and AMD CPUs;
- ``threads`` / ``interop_threads`` / ``logical_cpus``: torch's intra-op and inter-op thread counts and
  ``os.cpu_count()``; ``load_average_1m`` says how busy the machine was when the run started.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess

import torch

_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def _cpuinfo() -> tuple[str | None, str | None, set[str]]:
    """(model name, "vendor family F model M", flags) of the first CPU in /proc/cpuinfo."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
    except OSError:
        return None, None, set()

    def field(name):
        m = re.search(rf"^{name}\s*:\s*(.+)$", text, re.M)
        return m.group(1).strip() if m else None

    vendor, family, model_no = field("vendor_id"), field("cpu family"), field("model")
    ident = f"{vendor} family {family} model {model_no}" if vendor and family and model_no else None
    flags = field("flags")
    return field("model name"), ident, set(flags.split() if flags else ())


def _lscpu_model() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^Model name:\s*(.+)$", out, re.M)
    return m.group(1).strip() if m else None


def _config_value(config: str, pattern: str) -> str | None:
    m = re.search(pattern, config)
    return m.group(1).strip() if m else None


def describe() -> dict:
    """The machine description kept in every benchmark's JSON line (see the module docstring)."""
    model, ident, flags = _cpuinfo()
    config = torch.__config__.show()
    blas = _config_value(config, r"BLAS_INFO=([^,\s]+)") or "unknown"
    mkl = _config_value(config, r"Math Kernel Library Version ([^\s]+)")
    onednn = _config_value(config, r"MKL-DNN v([^\s]+)")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "cpu_model": model or _lscpu_model() or platform.processor() or "unknown",
        "cpu_id": ident,
        "cpu_flags": [f for f in _FLAGS if f in flags],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": blas,
        "mkl_version": mkl,
        "mkl_available": torch.backends.mkl.is_available(),
        "onednn_version": onednn,
        "onednn_available": torch.backends.mkldnn.is_available(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "logical_cpus": os.cpu_count(),
        "load_average_1m": None if load is None else round(load, 2),
    }


def describe_line(machine: dict | None = None) -> str:
    """One human-readable line of :func:`describe`'s dict."""
    m = describe() if machine is None else machine
    libs = f"BLAS {m['blas']}" + (f" (MKL {m['mkl_version']})" if m["mkl_version"] else "")
    libs += f", oneDNN {m['onednn_version'] if m['onednn_available'] else 'unavailable'}"
    ident = f" ({m['cpu_id']})" if m.get("cpu_id") else ""
    return (f"machine: {m['cpu_model']}{ident} [{' '.join(m['cpu_flags']) or 'no avx2'}], torch {m['torch']} "
            f"capability {m['cpu_capability']}, {libs}, threads {m['threads']}/{m['logical_cpus']} CPUs, "
            f"load {m['load_average_1m']}")
