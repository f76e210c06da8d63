"""Saving and loading converted hybrids.

A hybrid directory holds:

- ``config.json``: the BASE (teacher) transformers config, unchanged, so the decoder class and its
  ``layer_types`` (masks, RoPE) are rebuilt exactly;
- ``hybrid.json``: the :class:`~hybridlab.models.convert.HybridSpec` (FA layers, mixer kind, mixer
  config, q/k-norm mode, seed, base model) plus the format version, dtype, architecture, the
  hybridlab / transformers versions that wrote it and ``files``, the sha256 of every other file it
  wrote (written last, so its presence marks a complete directory);
- ``model.safetensors``: every parameter and persistent buffer (tied weights stored once);
- optionally ``generation_config.json`` and the tokenizer files.

``load_hybrid`` rebuilds the teacher architecture from ``config.json`` without random init, swaps in
the mixers from ``hybrid.json`` and loads the weights strictly: any missing, unexpected or mis-shaped
tensor, unreadable JSON, truncated safetensors or a file whose sha256 differs from ``files`` (damaged or
edited, whatever its mtime) raises one ``HybridlabError`` line naming the file and how to rebuild it.
Directories without ``files`` (older ones) load without the checksum check. A save that fails (a full
disk: one line) removes what it wrote; hybrid.json and the weights are written under a temporary name and
renamed, so a killed save never leaves a half file or a hybrid.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hybridlab.atomic import atomic_file, digests, disk_full, rebuild_hint, verify_digests, write_text
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
    existed = out.is_dir()
    before = {p.name for p in out.iterdir()} if existed else set()
    out.mkdir(parents=True, exist_ok=True)
    try:
        model.config.save_pretrained(out)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(out)
        with atomic_file(out / WEIGHTS_FILE) as tmp:
            save_model(model, str(tmp), metadata={"format": "pt"})
            _sort_metadata(tmp)
        written = {CONFIG_FILE, WEIGHTS_FILE} | ({"generation_config.json"} & {p.name for p in out.iterdir()})
        if tokenizer is not None:
            saved = tokenizer.save_pretrained(out)
            written |= {Path(f).name for f in saved or () if Path(f).parent == out and Path(f).is_file()}
        _write_spec(out, model, spec, digests(out, written), hybridlab.__version__, transformers.__version__)
    except Exception as exc:
        _remove_new(out, before, existed)  # no half-written hybrid under the final name
        if disk_full(exc):
            raise HybridlabError(f"no space left on device writing hybrid directory {out}; nothing was written "
                                 "there: free space and rerun the same command") from exc
        raise
    return out


def _sort_metadata(path: Path) -> None:
    """Sort the safetensors header's metadata keys in place (same bytes, reordered), so a model saved twice is
    byte-identical: safetensors adds the names of tied weights it dropped to the metadata, and writes that map
    in hash order, which changes from one process to the next."""
    import struct

    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = f.read(n).decode()
        start = '{"__metadata__":'
        if not header.startswith(start):
            return
        end = header.index("}", len(start)) + 1  # metadata values are strings: the first '}' closes it
        meta = json.loads(header[len(start):end])
        new = json.dumps(dict(sorted(meta.items())), separators=(",", ":"), ensure_ascii=False)
        if len(new.encode()) == len(header[len(start):end].encode()):
            f.seek(8 + len(start))
            f.write(new.encode())


def _remove_new(out: Path, before: set[str], existed: bool) -> None:
    import shutil

    if not existed:
        shutil.rmtree(out, ignore_errors=True)
        return
    for p in out.iterdir():
        if p.name not in before:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _write_spec(out: Path, model, spec, files: dict[str, str], version: str, transformers_version: str) -> None:
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "hybridlab_version": version,
        "transformers_version": transformers_version,
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
        "files": files,
    }
    write_text(out / SPEC_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")


def _fix(directory: Path) -> str:
    """How to rebuild a damaged hybrid directory: force the job that wrote it, or re-save it."""
    target = directory.parent / "index.json" if directory.parent.name == "score_checkpoints" else directory / CONFIG_FILE
    return rebuild_hint(target, default="re-save it with save_hybrid")


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
            f"'{directory}' is not a complete hybrid directory (missing {', '.join(missing)}); {_fix(directory)}"
        )
    try:
        record = json.loads((directory / SPEC_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HybridlabError(
            f"'{directory / SPEC_FILE}' is not valid JSON ({_first_line(exc)}); {_fix(directory)}"
        ) from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise HybridlabError(f"'{directory / SPEC_FILE}' is not a hybridlab hybrid spec; {_fix(directory)}")
    if record.get("format_version") != FORMAT_VERSION:
        raise HybridlabError(
            f"'{directory}' uses hybrid format version {record.get('format_version')}, this hybridlab reads "
            f"{FORMAT_VERSION}; {_fix(directory)}"
        )
    required = ("fa_layers", "mixer_kind", "mixer_config", "num_layers", "qk_norm", "seed", "dtype")
    absent = [k for k in required if k not in record]
    if absent:
        raise HybridlabError(f"'{directory / SPEC_FILE}' lacks {', '.join(absent)}; {_fix(directory)}")
    files = record.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise HybridlabError(f"'{directory / SPEC_FILE}' has a damaged 'files' checksum list; {_fix(directory)}")
    return record


def verify_hybrid(path) -> dict:
    """read_spec plus the sha256 of every file hybrid.json lists (none listed: written before checksums)."""
    directory = Path(path)
    record = read_spec(directory)
    verify_digests(directory, record.get("files", {}), _fix(directory), what="hybrid file")
    return record


def load_hybrid(path, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                weights: bool = True):
    """Rebuild a hybrid saved by save_hybrid, in eval mode; `dtype`/`device` default to the saved dtype and CPU.

    `weights=False` builds the structure only (no weights file is read): with `train.fsdp.params_on_meta`, the
    skeleton sharded ranks other than 0 pass to the training engine.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from hybridlab.models.convert import HybridSpec, apply_hybrid_structure

    directory = Path(path)
    if weights:
        record = verify_hybrid(directory)
    else:  # the files it reads (the weights are checked where they are read)
        record = read_spec(directory)
        listed = record.get("files", {})
        verify_digests(directory, {f: d for f, d in listed.items() if f != WEIGHTS_FILE}, _fix(directory),
                       what="hybrid file")
    try:
        config = AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise HybridlabError(
            f"'{directory / CONFIG_FILE}' is not a readable transformers config ({_first_line(exc)}); {_fix(directory)}"
        ) from exc
    saved_dtype = getattr(torch, record["dtype"], None)
    if not isinstance(saved_dtype, torch.dtype):
        raise HybridlabError(f"'{directory / SPEC_FILE}' names unknown dtype {record['dtype']!r}; {_fix(directory)}")
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
            f"'{directory / SPEC_FILE}' has an incompatible mixer_config ({_first_line(exc)}); {_fix(directory)}"
        ) from exc
    if not weights:
        return (model.to(device=device, dtype=dtype) if dtype is not None or device is not None else model).eval()
    try:
        missing, unexpected = load_model(model, str(directory / WEIGHTS_FILE), strict=False)
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise HybridlabError(
            f"cannot load '{directory / WEIGHTS_FILE}' ({_first_line(exc)}); the file is corrupt or from another "
            f"model: {_fix(directory)}"
        ) from exc
    if missing or unexpected:
        raise HybridlabError(
            f"'{directory / WEIGHTS_FILE}' does not match hybrid.json + config.json (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); {_fix(directory)}"
        )
    if dtype is not None or device is not None:
        model = model.to(device=device, dtype=dtype)
    return model.eval()
