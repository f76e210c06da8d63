"""A training run's work directory, keyed by what the run is made of.

Snakemake reruns a training job when its inputs, params or code change, and also when a killed job
left its outputs missing. Only the second case may resume the job's checkpoints. So the work
directory (checkpoints, metrics, step-0 evaluation) is ``<base>/<fingerprint>``, where the
fingerprint hashes the run's settings and the contents of its input files:

- identical settings and inputs find the same directory and resume it;
- anything changed (a mixture rebuilt with the same shape, another teacher, an edited setting)
  gives a new, empty directory, so the finished checkpoint of old inputs is never resumed and
  published as the new model. Directories of other fingerprints under ``<base>`` are deleted
  when a new one is created (this job can no longer resume them, and they hold checkpoints).

Files up to ``FULL_HASH_BYTES`` are hashed whole. Larger ones (paper-scale token arrays, tens of GB)
contribute their size, modification time and first and last MiB, so a rebuilt file always counts as
changed (new mtime) without reading it all; the cost of the shortcut is that copying identical
content (for example ``dvc checkout``) also starts a run over instead of resuming it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from hybridlab.errors import HybridlabError

FULL_HASH_BYTES = 1 << 30
_EDGE_BYTES = 1 << 20
FINGERPRINT_FILE = "fingerprint.json"


def _update_with_file(h, path: Path) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}\0{size}\0".encode())
    with open(path, "rb") as fh:
        if size <= FULL_HASH_BYTES:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
            return
        h.update(str(path.stat().st_mtime_ns).encode())
        h.update(fh.read(_EDGE_BYTES))
        fh.seek(size - _EDGE_BYTES)
        h.update(fh.read(_EDGE_BYTES))


# Settings that only say which checkpoints to keep: changing them resumes the run instead of restarting it.
NOT_FINGERPRINTED = frozenset({"keep_last_k", "final_checkpoint"})


def _trajectory(settings):
    if isinstance(settings, dict):
        return {k: _trajectory(v) for k, v in settings.items() if k not in NOT_FINGERPRINTED}
    return settings


def fingerprint(settings: dict, inputs: Iterable[str | Path]) -> str:
    """16 hex digits over the canonical JSON of ``settings`` and every input file's contents.

    An input directory contributes all its files (recursively, sorted, hidden ones skipped). An input
    that is not a local path (a hub id) contributes its name.
    """
    h = hashlib.sha256(json.dumps(_trajectory(settings), sort_keys=True, default=str).encode())
    for item in inputs:
        path = Path(item)
        h.update(b"\0input\0" if path.exists() else f"\0input\0{item}\0".encode())
        if path.is_file():
            _update_with_file(h, path)
        elif path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                rel = f.relative_to(path)
                if not any(part.startswith(".") for part in rel.parts):
                    h.update(rel.as_posix().encode())
                    _update_with_file(h, f)
    return h.hexdigest()[:16]


def work_dir(base: str | Path, settings: dict, inputs: Iterable[str | Path], *, restart: bool = False,
             is_main: bool = True) -> Path:
    """The run's work directory ``base/<fingerprint>`` (see module docstring), created if missing.

    ``restart`` empties it first. Only the main process deletes and writes; every process gets the
    same path (they hash the same settings and files).
    """
    base, inputs = Path(base), list(inputs)
    if base.exists() and not base.is_dir():
        raise HybridlabError(f"work directory {base} is a file; remove it or pass another --work")
    fp = fingerprint(settings, inputs)
    work = base / fp
    if is_main:
        if restart:
            shutil.rmtree(work, ignore_errors=True)
        if base.is_dir():
            for other in base.iterdir():
                if other.name != fp:
                    print(f"{base}: removing the work directory of other settings or inputs ({other.name})")
                    shutil.rmtree(other, ignore_errors=True) if other.is_dir() else other.unlink()
        work.mkdir(parents=True, exist_ok=True)
        (work / FINGERPRINT_FILE).write_text(json.dumps({"fingerprint": fp, "settings": settings,
                                                         "inputs": [str(i) for i in inputs]},
                                                        indent=1, sort_keys=True, default=str) + "\n")
    else:
        work.mkdir(parents=True, exist_ok=True)
    return work
