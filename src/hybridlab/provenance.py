"""Provenance: what made an artifact - config subset, its hash, the git commit, package versions.

Written next to every workflow output as `provenance.json` (inside an output directory) or
`<file>.provenance.json` (beside an output file). No timestamps or host names, so an unchanged
rerun writes identical bytes and DVC caches stay valid.
"""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from hybridlab.atomic import write_text
from hybridlab.config import config_hash

PACKAGES = ("hybridlab", "torch", "transformers", "flash-linear-attention", "fla-core", "triton", "snakemake",
            "dvc", "datasets", "polars", "numpy", "tokenizers", "safetensors", "seaborn", "matplotlib")


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_commit(repo: Path) -> str:
    """HEAD commit of the checkout, with '+dirty' when tracked files differ; 'unknown' outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def record(params: dict, script: str, repo: Path) -> dict:
    return {
        "script": script,
        "params": params,
        "config_hash": config_hash(params),
        "git_commit": git_commit(repo),
        "python": platform.python_version(),
        "packages": package_versions(),
    }


def write(out: str | Path, params: dict, script: str, repo: Path) -> Path:
    """Write the provenance record for output `out` (a directory or a file); returns its path."""
    out = Path(out)
    path = out / "provenance.json" if out.is_dir() else out.with_name(out.name + ".provenance.json")
    write_text(path, json.dumps(record(params, script, repo), indent=1, sort_keys=True) + "\n")
    return path
