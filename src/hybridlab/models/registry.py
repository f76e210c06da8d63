"""Loading causal LMs and tokenizers from a local directory or the Hugging Face hub, with one-line errors.

- A local directory loads directly; one holding a ``hybrid.json`` is a hybridlab hybrid and goes
  through :func:`hybridlab.models.io.load_hybrid`.
- Anything else is a hub name for ``from_pretrained``. The ways that can fail (gated repo, missing or
  private repo, bad revision, offline or unreachable hub, custom code not trusted, architecture
  unknown to this transformers) are mapped from the huggingface_hub / transformers exceptions, found
  anywhere on the exception chain, to a :class:`HybridlabError` whose one line names the model and
  the fix (``HF_TOKEN`` / ``huggingface-cli login``, a local path, ``trust_remote_code``...).
- Every loaded model gets :func:`hybridlab.models.native.patch_model_for_device`, so transformers'
  own hybrids (Qwen3.5, OLMo-Hybrid, Qwen3-Next, Granite-4.0-H) run on CPU even with fla installed.
  The patch dispatches per call on the tensors' device, so it leaves CUDA runs on fla's kernels.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from hybridlab.data.local_sources import resolve_model_source
from hybridlab.errors import HybridlabError

HYBRID_SPEC = "hybrid.json"
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _hub_error_line(name: str, exc: BaseException) -> str | None:
    """The one-line explanation for a hub/transformers loading failure, or None if it is not one of those."""
    chain = list(_chain(exc))
    login = "set HF_TOKEN or run `huggingface-cli login`"
    for e in chain:
        if isinstance(e, GatedRepoError):
            return (
                f"model '{name}' is gated: accept its terms at https://huggingface.co/{name}, then {login} "
                "(or pass a local path)"
            )
    for e in chain:
        if isinstance(e, RevisionNotFoundError):
            return f"model '{name}' has no such revision on the hub; check the revision or pass a local path"
        if isinstance(e, RepositoryNotFoundError):
            return (
                f"model '{name}' is not a local directory and not a hub repository you can access; check the name, "
                f"{login} for private repos, or pass a local path"
            )
        if isinstance(e, HFValidationError):
            return f"model '{name}' is neither an existing local directory nor a valid hub id 'org/name'; fix the path or name"
        if isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
            return (
                f"model '{name}' is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE=1) or "
                f"unreachable; download it once online ({login} for gated models) or pass a local path"
            )
        if isinstance(e, HfHubHTTPError):
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):
                return f"model '{name}' refused access (HTTP {status}); {login} with a token that can read it"
            return f"model '{name}' could not be fetched from the hub (HTTP {status}); retry, or pass a local path"
    text = " ".join(str(e) for e in chain)
    if "trust_remote_code" in text:
        return f"model '{name}' ships its own modelling code; pass trust_remote_code=True if you trust it"
    if "does not recognize this architecture" in text:
        return (
            f"model '{name}' has an architecture this transformers ({_tf_version()}) does not know; upgrade "
            "transformers or pass trust_remote_code=True for remote-code models"
        )
    if "couldn't connect to" in text or "We couldn't connect" in text:
        return (
            f"model '{name}' is not in the local Hugging Face cache and the hub is unreachable; download it once "
            f"online ({login} for gated models) or pass a local path"
        )
    return None


def _tf_version() -> str:
    import transformers

    return transformers.__version__


def _resolve_dtype(dtype, device=None):
    """A torch dtype from its name; "fast" is bfloat16 where bf16 matmuls beat fp32 on `device` (CUDA, a CPU
    with AMX: `hybridlab.device.bf16_is_fast`), else float32."""
    if dtype == "fast":
        from hybridlab.device import fast_dtype

        kind = torch.device(device).type if isinstance(device, (str, torch.device)) and device != "auto" else (
            "cuda" if device == "auto" and torch.cuda.is_available() else "cpu")
        dtype = fast_dtype(dtype, kind)
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise HybridlabError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}, 'auto', 'fast', or a torch.dtype")


def _local_dir(name_or_path: str | os.PathLike) -> Path | None:
    """The directory if `name_or_path` names a local one; raise if it looks like a path that does not exist."""
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep != "/" and os.sep in text
    if path.exists() or looks_like_path:
        what = "is a file, not a model directory" if path.exists() else "does not exist"
        raise HybridlabError(f"local model path '{text}' {what}; give a directory with config.json or a hub id 'org/name'")
    return None


def _is_hybrid_dir(path: Path) -> bool:
    return (path / HYBRID_SPEC).is_file()


def load_causal_lm(name_or_path, *, dtype=None, trust_remote_code: bool = False, device_map=None):
    """Load a causal LM (hub id, local directory or hybridlab hybrid directory), patched to run on CPU."""
    from transformers import AutoModelForCausalLM

    from hybridlab.models.native import patch_model_for_device

    torch_dtype = _resolve_dtype(dtype, device_map)
    name_or_path = resolve_model_source(name_or_path)  # config local_sources.models: hub id -> local dir
    local = _local_dir(name_or_path)
    name = os.fspath(name_or_path)
    if local is not None and _is_hybrid_dir(local):
        from hybridlab.models.io import load_hybrid

        if device_map is not None and not isinstance(device_map, (str, torch.device)):
            raise HybridlabError(f"hybrid directory '{local}' loads onto one device; pass device_map='cpu' or 'cuda'")
        return load_hybrid(local, dtype=None if torch_dtype == "auto" else torch_dtype, device=device_map)
    if local is not None and not (local / "config.json").is_file():
        raise HybridlabError(
            f"'{local}' has no config.json; give a directory written by save_pretrained or save_hybrid, or a hub id"
        )
    kwargs = {"trust_remote_code": trust_remote_code}
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        model = AutoModelForCausalLM.from_pretrained(str(local) if local else name, **kwargs)
    except (OSError, ValueError) as exc:
        line = _hub_error_line(name, exc)
        if line is None:
            raise
        raise HybridlabError(line) from exc
    patch_model_for_device(model)
    return model


def load_tokenizer_for(name_or_path):
    """Load the tokenizer of a hub id or local directory (for a hybrid: the one saved next to it)."""
    from transformers import AutoTokenizer

    name_or_path = resolve_model_source(name_or_path)
    local = _local_dir(name_or_path)
    name = os.fspath(name_or_path)
    if local is not None and not any((local / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise HybridlabError(
            f"no tokenizer files in '{local}'; save one there (tokenizer.save_pretrained or save_hybrid(..., "
            "tokenizer=tok)) or load the base model's tokenizer by its name"
        )
    try:
        return AutoTokenizer.from_pretrained(str(local) if local else name)
    except (OSError, ValueError) as exc:
        line = _hub_error_line(name, exc)
        if line is None:
            raise
        raise HybridlabError(line) from exc
