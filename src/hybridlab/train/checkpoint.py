"""Atomic, resumable, sharded training checkpoints (`torch.distributed.checkpoint`, DCP).

Layout: `<out_dir>/checkpoints/step_<9 digits>/` holding
- the DCP files (`.metadata`, `__<rank>_0.distcp`): the model weights (`model/<name>`) and the
  optimiser state (`optim/<name>/<key>`, e.g. AdamW's `exp_avg`), each rank writing its own shards.
  DCP stores global shapes and reshards on load, so a run saved by 2 processes resumes on 1 or 4;
- `state.pt` (rank 0, `torch.load(weights_only=True)`): step, tokens, the config hash, the run
  fingerprint (the caller's hash of its inputs, if any), the world size it was written with, the
  optimiser kind and which state each parameter holds (so the load template has the same keys), the
  data sampler position and the RNG states of every rank (python, numpy, torch CPU, CUDA). The lr
  schedule is a function of the step, so it needs no state of its own.

A checkpoint is written into `.tmp_step_…` by all ranks, then rank 0 writes `state.pt` and
`checksums.sha256` (the sha256 of every file, `hybridlab.atomic.write_manifest`), fsyncs and renames the
directory into place, so a run killed while writing leaves either the complete directory or an ignored
temp directory; a full disk removes the temp directory and stops with one line. On resume the checksums
are verified (split over the ranks), so a damaged or edited file is named before anything is loaded;
checkpoints without checksums (older ones) are read as before. Only the newest `keep_last_k` are kept. Checkpoints with
non-finite weights are never written. A checkpoint that cannot be read or does not fit the run
(truncated file, other model shapes, other config hash or fingerprint) raises a one-line
`HybridlabError` naming the file and the fix, before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
from pathlib import Path
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn

from hybridlab.atomic import disk_full, publish, verify_manifest, write_manifest
from hybridlab.errors import HybridlabError

STATE_FILE = "state.pt"
FORMAT_VERSION = 2
_DIR_RE = re.compile(r"^step_(\d{9})$")
_FIX = "delete it to resume from the previous checkpoint, or rerun with --restart to start over"


def step_dir_name(step: int) -> str:
    return f"step_{step:09d}"


def list_checkpoints(ckpt_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints as (step, path), oldest first; temp directories are ignored."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if p.is_dir() and (m := _DIR_RE.match(p.name))]
    return sorted(found)


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(ckpt_dir)
    return ckpts[-1][1] if ckpts else None


def capture_rng() -> dict[str, Any]:
    """This process's RNG states in a weights_only-loadable form (numpy arrays become tensors)."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],  # one per visible device
    }


def restore_rng(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    n = s["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        # a run resumed with fewer visible devices restores the ones it has (set_rng_state_all would index
        # past them); the devices a process drives come first in its visible list
        for i, state in enumerate(s["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, i)


def save_checkpoint(ckpt_dir: str | Path, step: int, model: nn.Module, optimizers: dict[str, torch.optim.Optimizer],
                    state: dict[str, Any], keep_last_k: int, *, is_main: bool = True, barrier=lambda: None) -> Path:
    """Write `step_<step>/` atomically (collective: every rank calls it), then keep the newest `keep_last_k`."""
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / step_dir_name(step)
    tmp = ckpt_dir / f".tmp_{step_dir_name(step)}"
    if is_main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a run killed while writing
        tmp.mkdir()
    barrier()
    names = _param_names(model)
    optim, held = {}, {}
    for opt in optimizers.values():
        for p, st in opt.state.items():
            name = names[id(p)]
            optim[name] = {k: v for k, v in st.items() if isinstance(v, torch.Tensor)}
            held[name] = {k: (list(v.shape), str(v.dtype).removeprefix("torch."), _is_param_like(v, p))
                          for k, v in optim[name].items()}
    try:
        with _single_process_quiet():
            dcp.save({"model": model.state_dict(), "optim": optim}, checkpoint_id=str(tmp), no_dist=not _distributed())
        barrier()
        if is_main:
            # through a Python file object: a full disk then raises OSError(ENOSPC); torch's own path writer
            # reports it as a bare RuntimeError that names neither the cause nor the file
            with open(tmp / STATE_FILE, "wb") as f:
                torch.save({**state, "format": FORMAT_VERSION, "step": step, "optim_held": held}, f)
            write_manifest(tmp)  # last: the checksums of every file above
            for f in tmp.iterdir():
                _fsync(f)
    except (Exception, CheckpointException) as e:  # DCP's exception derives from BaseException
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(e):
            raise HybridlabError(f"no space left on device writing checkpoint {final}; nothing was written there: "
                                 "free space and rerun the same command (training resumes from the last "
                                 "checkpoint)") from e
        raise
    if is_main:
        publish(tmp, final)  # a step re-written deliberately replaces the old directory in a short swap
        _fsync(ckpt_dir)
        for _, path in list_checkpoints(ckpt_dir)[:-keep_last_k]:
            shutil.rmtree(path)
    barrier()
    return final


def read_state(path: str | Path, config_hash: str, fingerprint: str | None) -> dict[str, Any]:
    """The small rank-0 state of a checkpoint, checked against this run; HybridlabError if unusable."""
    path = Path(path)
    state_file = path / STATE_FILE
    share = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if _distributed() else (0, 1)
    verify_manifest(path, _FIX, what="checkpoint file", share=share)
    try:
        state = torch.load(state_file, weights_only=True, map_location="cpu")
    except Exception as e:  # any unreadable file is reported the same way: name it and the fix
        raise HybridlabError(f"checkpoint file {state_file} is unreadable ({_short(e)}); {_FIX}") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise HybridlabError(f"checkpoint file {state_file} has an unknown format; {_FIX}")
    if state.get("config_hash") != config_hash:
        raise HybridlabError(
            f"checkpoint {path} was written with a different training config "
            f"(hash {state.get('config_hash')} != {config_hash}); rerun with the original config, "
            "or rerun with --restart to start over"
        )
    if state.get("fingerprint") != fingerprint:
        raise HybridlabError(
            f"checkpoint {path} belongs to another run (its inputs fingerprint {state.get('fingerprint')} != "
            f"{fingerprint}); point the run at a fresh work directory, or rerun with --restart to start over"
        )
    return state


def load_checkpoint(path: str | Path, model: nn.Module, optimizers: dict[str, torch.optim.Optimizer],
                    state: dict[str, Any]) -> None:
    """Load weights and optimiser state in place (collective), resharding to this run's layout."""
    path = Path(path)
    by_name = dict(model.named_parameters())
    template: dict[str, dict[str, torch.Tensor]] = {}
    for name, keys in state["optim_held"].items():
        p = by_name.get(name)
        if p is None:
            raise HybridlabError(f"checkpoint {path} has optimiser state for {name!r}, which this model lacks; {_FIX}")
        template[name] = {k: torch.zeros_like(p, dtype=getattr(torch, dt)) if like
                          else torch.zeros(shape, dtype=getattr(torch, dt)) for k, (shape, dt, like) in keys.items()}
    sd = {"model": model.state_dict(), "optim": template}
    try:
        with _single_process_quiet():
            dcp.load(sd, checkpoint_id=str(path), no_dist=not _distributed())
    except (Exception, CheckpointException) as e:  # DCP's exception derives from BaseException
        raise HybridlabError(f"checkpoint {path} is unreadable or does not fit this model ({_short(e)}); {_FIX}") from e
    owner = {id(p): opt for opt in optimizers.values() for g in opt.param_groups for p in g["params"]}
    for name, st in template.items():
        p = by_name[name]
        if id(p) not in owner:
            raise HybridlabError(f"checkpoint {path} has optimiser state for {name!r}, which this run does not "
                                 f"train; {_FIX}")
        owner[id(p)].state[p] = st


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns that it assumes one process whenever torch.distributed is not initialised; a single-process
    run asks for exactly that (no_dist), so the warning would only clutter the job's log."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable or uninitialized")
        yield


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _is_param_like(v: torch.Tensor, p: torch.Tensor) -> bool:
    return tuple(v.shape) == tuple(p.shape) and v.ndim > 0


def remove_run_outputs(out_dir: str | Path, ckpt_subdir: str, files: tuple[str, ...]) -> None:
    """What `--restart` does: delete the checkpoints and the listed files of a previous run."""
    out = Path(out_dir)
    shutil.rmtree(out / ckpt_subdir, ignore_errors=True)
    for f in files:
        (out / f).unlink(missing_ok=True)


def _short(e: BaseException) -> str:
    if isinstance(e, CheckpointException) and e.failures:  # the first rank's own error, not DCP's traceback
        e = next(iter(e.failures.values()))
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg[:200]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
