"""The one device policy: which torch device a job runs on.

`resolve_device(pref, local_rank)`: "auto" (or None) is the local GPU `cuda:<local_rank>` when CUDA is
available, else the CPU; "cpu" is the CPU; "cuda" is `cuda:<local_rank>` and a one-line `HybridlabError`
when no GPU is visible (so is an explicit "cuda:<n>"). Training (`hybridlab.train.distributed`) and the
analyses (`hybridlab.eval`) all call it. Imports only torch and `hybridlab.errors`, so it sits below every layer.
"""

from __future__ import annotations

import re

import torch

from hybridlab.errors import HybridlabError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(pref: str | torch.device | None = "auto", local_rank: int = 0) -> torch.device:
    """The device for preference `pref` on local rank `local_rank`: one of DEVICES (None means "auto"),
    an explicit "cuda:<n>", or a torch.device (returned as it is)."""
    if isinstance(pref, torch.device):
        return pref
    pref = "auto" if pref is None else pref
    explicit = isinstance(pref, str) and re.fullmatch(r"cuda:\d+", pref) is not None
    if pref not in DEVICES and not explicit:
        raise HybridlabError(f"device={pref!r} is not a device choice; use one of {', '.join(DEVICES)} (or cuda:<n>)")
    if pref == "cuda" or explicit or (pref == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise HybridlabError(f"device={pref} but no CUDA device is visible; set device: cpu or auto")
        return torch.device(pref) if explicit else torch.device("cuda", local_rank)
    return torch.device("cpu")
