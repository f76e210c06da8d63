"""How a training script is started for a given process count (the rules' `launcher`).

One process: plain `python`. More: `python -m torch.distributed.run --standalone --nproc_per_node N`
(torchrun's module form, so it uses the same interpreter and environment as the rule). The loop
joins the process group from torchrun's environment (gloo on CPU, nccl on CUDA) and shards with
FSDP2, so the same script runs under both.
"""

from __future__ import annotations

from hybridlab.errors import HybridlabError


def launch_prefix(nproc: int, python: str = "python") -> str:
    if not isinstance(nproc, int) or nproc < 1:
        raise HybridlabError(f"process count {nproc!r} must be a whole number >= 1")
    if nproc == 1:
        return python
    return f"{python} -m torch.distributed.run --standalone --nproc_per_node {nproc}"
