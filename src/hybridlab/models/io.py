"""Saving and loading converted hybrids.

A hybrid directory holds:

- ``config.json``: the BASE (teacher) transformers config, unchanged, so the decoder class and its
  ``layer_types`` (masks, RoPE) are rebuilt exactly;
- ``hybrid.json``: the :class:`~hybridlab.models.convert.HybridSpec` (FA layers, mixer kind, mixer
  config, q/k-norm mode, seed, base model) plus the format version, dtype, architecture and the
  hybridlab / transformers versions that wrote it;
- ``model.safetensors``: every parameter and persistent buffer (tied weights stored once);
- optionally ``generation_config.json`` and the tokenizer files.

``load_hybrid`` rebuilds the teacher architecture from ``config.json`` without random init, swaps in
the mixers from ``hybrid.json`` and loads the weights strictly: any missing, unexpected or mis-shaped
tensor, unreadable JSON or truncated safetensors raises one ``HybridlabError`` line.
Files are written to a temporary name and renamed, so a killed save never leaves a half file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hybridlab.atomic import atomic_file, write_text
from hybridlab.errors import HybridlabError

SPEC_FILE = "hybrid.json"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
FORMAT = "hybridlab-hybrid"
FORMAT_VERSION = 1


def save_hybrid(model, path, *, tokenizer=None) -> Path:
    """Write `model` (a converted hybrid) to directory `path`; returns the directory."""
    import transformers
    from safetensors.torch import save_model

    import hybridlab
    from hybridlab.models.convert import hybrid_spec

    spec = hybrid_spec(model)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    with atomic_file(out / WEIGHTS_FILE) as tmp:
        save_model(model, str(tmp), metadata={"format": "pt"})
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "hybridlab_version": hybridlab.__version__,
        "transformers_version": transformers.__version__,
        "architecture": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "fa_layers": spec.fa_layers,
        "mixer_kind": spec.mixer_kind,
        "mixer_config": spec.mixer_config,
        "num_layers": spec.num_layers,
        "qk_norm": spec.qk_norm,
        "seed": spec.seed,
        "base_model": spec.base_model,
        "layer_types": spec.layer_types,
        "extra": spec.extra,
    }
    write_text(out / SPEC_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_spec(path) -> dict:
    """The parsed and validated hybrid.json of a hybrid directory."""
    directory = Path(path)
    if not directory.is_dir():
        raise HybridlabError(f"hybrid directory '{directory}' does not exist; give a directory written by save_hybrid")
    missing = [f for f in (SPEC_FILE, CONFIG_FILE, WEIGHTS_FILE) if not (directory / f).is_file()]
    if missing:
        raise HybridlabError(
            f"'{directory}' is not a complete hybrid directory (missing {', '.join(missing)}); re-save it with save_hybrid"
        )
    try:
        record = json.loads((directory / SPEC_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HybridlabError(f"'{directory / SPEC_FILE}' is not valid JSON ({_first_line(exc)}); re-save the hybrid") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise HybridlabError(f"'{directory / SPEC_FILE}' is not a hybridlab hybrid spec; re-save it with save_hybrid")
    if record.get("format_version") != FORMAT_VERSION:
        raise HybridlabError(
            f"'{directory}' uses hybrid format version {record.get('format_version')}, this hybridlab reads "
            f"{FORMAT_VERSION}; re-save it with this hybridlab version"
        )
    required = ("fa_layers", "mixer_kind", "mixer_config", "num_layers", "qk_norm", "seed", "dtype")
    absent = [k for k in required if k not in record]
    if absent:
        raise HybridlabError(f"'{directory / SPEC_FILE}' lacks {', '.join(absent)}; re-save it with save_hybrid")
    return record


def load_hybrid(path, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None):
    """Rebuild a hybrid saved by save_hybrid, in eval mode; `dtype`/`device` default to the saved dtype and CPU."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from hybridlab.models.convert import HybridSpec, apply_hybrid_structure

    directory = Path(path)
    record = read_spec(directory)
    try:
        config = AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise HybridlabError(
            f"'{directory / CONFIG_FILE}' is not a readable transformers config ({_first_line(exc)}); re-save the hybrid"
        ) from exc
    saved_dtype = getattr(torch, record["dtype"], None)
    if not isinstance(saved_dtype, torch.dtype):
        raise HybridlabError(f"'{directory / SPEC_FILE}' names unknown dtype {record['dtype']!r}; re-save the hybrid")
    spec = HybridSpec(
        fa_layers=list(record["fa_layers"]),
        mixer_kind=record["mixer_kind"],
        mixer_config=dict(record["mixer_config"]),
        num_layers=int(record["num_layers"]),
        qk_norm=record["qk_norm"],
        seed=int(record["seed"]),
        base_model=record.get("base_model"),
        extra=dict(record.get("extra") or {}),
    )
    # Every parameter is overwritten by the strict load below, so skip the (slow) random init.
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=saved_dtype)
    model.tie_weights()  # no_init_weights also skips init_weights(), which is where transformers ties embeddings
    try:
        apply_hybrid_structure(model, spec)
    except TypeError as exc:  # MixerConfig(**mixer_config) with fields this hybridlab does not know
        raise HybridlabError(
            f"'{directory / SPEC_FILE}' has an incompatible mixer_config ({_first_line(exc)}); re-save the hybrid"
        ) from exc
    try:
        missing, unexpected = load_model(model, str(directory / WEIGHTS_FILE), strict=False)
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise HybridlabError(
            f"cannot load '{directory / WEIGHTS_FILE}' ({_first_line(exc)}); the file is corrupt or from another model"
        ) from exc
    if missing or unexpected:
        raise HybridlabError(
            f"'{directory / WEIGHTS_FILE}' does not match hybrid.json + config.json (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); re-save the hybrid"
        )
    if dtype is not None or device is not None:
        model = model.to(device=device, dtype=dtype)
    return model.eval()
