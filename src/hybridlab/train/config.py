"""`TrainConfig`: the one validated configuration of the shared training loop.

Definitions (used by every trainer: pre-training, distillation, BLD):

- A *step* is one optimiser update. "step" in metrics, checkpoints and hooks always counts updates
  **completed** so far: `on_step_start(step, ...)` runs before update number `step` (0-based), the
  metrics row and checkpoint written after it carry `step + 1`.
- The *global batch* of one update is `micro_batch_size * grad_accum` sequences, independent of the
  number of processes: under `torchrun` with W processes each rank runs `grad_accum / W` micro-batches
  (as nanoGPT does), so the same config gives the same loss curve on 1 or W processes.
- Training length is either `steps` or a `token_budget` (with `seq_len`):
  `steps = ceil(token_budget / (micro_batch_size * grad_accum * seq_len))`.
- `config_hash()` covers every field that changes the training trajectory; fields that only say
  where/how often to write (out_dir, log/eval/ckpt cadence, keep_last_k, final_checkpoint, progress,
  device) and how the work is laid out (activation_checkpointing, fsdp) are excluded so a run can be resumed with a different cadence or on another machine.

The fields, their types and help are the `TrainRun` config section (`hybridlab.config_spec`); validation
collects every bad field and raises one `HybridlabError`, one line naming each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from hybridlab.config_spec.train_sections import TrainRun
from hybridlab.config_spec.validate import field_problems
from hybridlab.errors import HybridlabError


def tokens_per_update(micro_batch_size: int, grad_accum: int, seq_len: int) -> int:
    """Tokens of one optimiser update: the global batch (micro_batch_size x grad_accum sequences, whatever the
    process count) times the sequence length."""
    return micro_batch_size * grad_accum * seq_len


def stage_tokens(run: dict, seq_len: int) -> int:
    """Tokens a run trains on from its config section: `token_budget` when set, else steps x tokens per update
    (0 for a section that sets neither)."""
    if run.get("token_budget"):
        return int(run["token_budget"])
    return run.get("steps", 0) * tokens_per_update(run.get("micro_batch_size", 0), run.get("grad_accum", 1), seq_len)


# Fields that do not change the trajectory of the weights (see module docstring).
_NOT_HASHED = frozenset(
    {"out_dir", "log_every", "eval_every", "ckpt_every", "keep_last_k", "final_checkpoint", "progress", "device",
     "activation_checkpointing", "fsdp"}
)


@dataclass(kw_only=True)
class TrainConfig(TrainRun):
    """Everything the training loop needs: the `TrainRun` section (its fields, types and help), validated once
    in `__post_init__` against that section's schema plus the rules between fields."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # YAML gives lists
        self.no_decay_patterns = tuple(self.no_decay_patterns)
        self.muon_exclude_patterns = tuple(self.muon_exclude_patterns)
        self.lr_multipliers = dict(self.lr_multipliers)
        data = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        problems = field_problems(TrainRun, data) + _between_fields(self)
        if problems:
            raise HybridlabError("invalid TrainConfig: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """Build from a plain dict (e.g. a config.yaml section); unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HybridlabError(
                f"unknown TrainConfig keys {unknown}; remove them or use one of {sorted(known)}"
            )
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def batch_size(self) -> int:
        """Global batch: sequences per optimiser update, over all processes."""
        return self.micro_batch_size * self.grad_accum

    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        assert self.token_budget is not None and self.seq_len is not None  # validated
        return math.ceil(self.token_budget / tokens_per_update(self.micro_batch_size, self.grad_accum, self.seq_len))

    def optimizer_for_update(self, step: int) -> str:
        """Which optimiser family runs update number `step` (0-based)."""
        if self.optimizer_switch_step is not None and step >= self.optimizer_switch_step:
            return self.optimizer_after_switch  # type: ignore[return-value]
        return self.optimizer

    def resolved_precision(self, device_type: str) -> str:
        """"auto" means bf16 autocast on CUDA and plain fp32 on CPU; "fast" bf16 wherever its matmuls beat
        fp32 ones (CUDA, CPUs with AMX: `device.bf16_is_fast`), else fp32."""
        if self.precision == "auto":
            return "bf16" if device_type == "cuda" else "fp32"
        if self.precision == "fast":
            from hybridlab.device import bf16_is_fast

            return "bf16" if bf16_is_fast(device_type) else "fp32"
        return self.precision

    def config_hash(self) -> str:
        d = {k: v for k, v in self.to_dict().items() if k not in _NOT_HASHED}
        blob = json.dumps(d, sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _between_fields(c: TrainConfig) -> list[str]:
    """The rules a field's own type cannot say: one training length, its sequence length, the warmup within it,
    both halves of an optimiser switch, finite numbers."""
    p = []
    if (c.steps is None) == (c.token_budget is None):
        p.append("steps/token_budget: set exactly one of them (a step count or a token budget)")
    if c.token_budget is not None and c.seq_len is None:
        p.append("seq_len=None: required with token_budget (tokens per sequence)")
    if isinstance(c.steps, int) and isinstance(c.warmup_steps, int) and c.warmup_steps > c.steps:
        p.append(f"warmup_steps={c.warmup_steps}: longer than steps={c.steps}; shorten the warmup")
    if (c.optimizer_switch_step is None) != (c.optimizer_after_switch is None):
        p.append("optimizer_switch_step/optimizer_after_switch: set both (a step and an optimizer) or neither")
    numbers = {"lr": c.lr, "weight_decay": c.weight_decay, "eps": c.eps, "grad_clip": c.grad_clip,
               "muon_lr": c.muon_lr, **{f"lr_multipliers[{k!r}]": v for k, v in c.lr_multipliers.items()}}
    p += [f"{k}={v!r}: must be a finite number" for k, v in numbers.items()
          if isinstance(v, float) and not math.isfinite(v)]
    return p
