"""Learning-rate schedules as a pure function of the update index.

For update `step` (0-based) of `total` updates with `warmup` warm-up updates and final ratio
`r = min_lr_ratio`, the learning rate is `lr * lr_factor(step, ...)` where

- warm-up (`step < warmup`):  factor = (step + 1) / warmup   (linear ramp; never exactly 0)
- afterwards, with progress `x = (step - warmup) / (total - warmup)` in [0, 1):
  - "constant": 1
  - "linear":   1 - (1 - r) * x
  - "cosine":   r + (1 - r) * (1 + cos(pi * x)) / 2

The first post-warm-up update runs at the peak lr; the decay approaches (but does not reach) `r`
at the last update, as in nanoGPT-style schedules. The loop recomputes the lr from the step each
update, so the "scheduler state" in a checkpoint is just the step.
"""

from __future__ import annotations

import math

from hybridlab.errors import HybridlabError


def lr_factor(step: int, total: int, warmup: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for update `step` (0-based); see the module docstring."""
    if not 0 <= step < total:
        raise HybridlabError(f"lr_factor: step {step} outside [0, {total}); pass a step of this run")
    if step < warmup:
        return (step + 1) / warmup
    x = (step - warmup) / (total - warmup)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * x
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * x))
    raise HybridlabError(f"unknown lr schedule {schedule!r}; use cosine, constant or linear")
