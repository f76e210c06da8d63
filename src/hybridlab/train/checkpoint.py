"""Atomic, resumable training checkpoints.

Layout: `<out_dir>/checkpoints/step_<9 digits>/` holding
- `model.safetensors`: the model weights (`safetensors.torch.save_model`, tied weights stored once);
- `state.pt`: a `torch.load(weights_only=True)`-loadable dict with the optimiser state, the data
  sampler position, step, tokens, the config hash, the world size and the RNG states of every rank
  (python, numpy, torch CPU, CUDA if any). The lr schedule is a function of the step, so it needs
  no state of its own.

A checkpoint is written into `.tmp_step_…`, fsynced, then renamed into place, so a run killed while
writing leaves either the complete directory or an ignored temp directory. The latest checkpoint is
found by scanning directory names; only the newest `keep_last_k` are kept. Checkpoints with
non-finite weights are never written. A checkpoint that cannot be read or does not fit the run
(truncated file, other model shapes, other config hash) raises a one-line `HybridlabError` naming
the file and the fix.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from torch import nn

from hybridlab.errors import HybridlabError

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
FORMAT_VERSION = 1
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
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
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
        torch.cuda.set_rng_state_all(s["cuda"])


def check_finite(model: nn.Module, step: int) -> None:
    """Raise if any weight is NaN/Inf: such a checkpoint must never replace a good one."""
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise HybridlabError(
                f"refusing to write checkpoint at step {step}: parameter {name} has NaN/Inf values; "
                "lower the lr or check the data, then rerun to resume from the last good checkpoint"
            )


def save_checkpoint(ckpt_dir: str | Path, step: int, model: nn.Module, state: dict[str, Any], keep_last_k: int) -> Path:
    """Write `step_<step>/` atomically, then delete all but the newest `keep_last_k` checkpoints."""
    check_finite(model, step)
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / step_dir_name(step)
    tmp = ckpt_dir / f".tmp_{step_dir_name(step)}"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a run killed while writing
    tmp.mkdir()
    save_model(model, str(tmp / MODEL_FILE))
    torch.save({**state, "format": FORMAT_VERSION, "step": step}, tmp / STATE_FILE)
    for f in (MODEL_FILE, STATE_FILE):
        _fsync(tmp / f)
    if final.exists():  # only when a step is re-written deliberately; keep the swap short
        old = ckpt_dir / f".old_{step_dir_name(step)}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _fsync(ckpt_dir)
    for _, path in list_checkpoints(ckpt_dir)[:-keep_last_k]:
        shutil.rmtree(path)
    return final


def load_checkpoint(path: str | Path, model: nn.Module, config_hash: str) -> dict[str, Any]:
    """Load weights into `model` and return the training state; HybridlabError if unusable."""
    path = Path(path)
    state_file, model_file = path / STATE_FILE, path / MODEL_FILE
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
    try:
        load_model(model, str(model_file), strict=True)
    except Exception as e:
        raise HybridlabError(
            f"checkpoint file {model_file} does not fit this model ({_short(e)}); {_FIX}"
        ) from e
    return state


def remove_run_outputs(out_dir: str | Path, ckpt_subdir: str, files: tuple[str, ...]) -> None:
    """What `--restart` does: delete the checkpoints and the listed files of a previous run."""
    out = Path(out_dir)
    shutil.rmtree(out / ckpt_subdir, ignore_errors=True)
    for f in files:
        (out / f).unlink(missing_ok=True)


def _short(e: Exception) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg[:200]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
