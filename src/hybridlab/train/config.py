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

Validation collects every bad field and raises one `HybridlabError` with one line per field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from hybridlab.errors import HybridlabError

SCHEDULES = ("cosine", "constant", "linear")
OPTIMIZERS = ("adamw", "muon")
PRECISIONS = ("auto", "fp32", "bf16", "fast")
DEVICES = ("auto", "cpu", "cuda")
FSDP = ("auto", "always")
FINAL_CHECKPOINTS = ("full", "weights")
MUON_ADJUST_LR = ("original", "match_rms_adamw")


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


@dataclass
class TrainConfig:
    """Everything the training loop needs; validated once in `__post_init__`."""

    out_dir: str
    steps: int | None = None
    token_budget: int | None = None
    seq_len: int | None = None
    micro_batch_size: int = 8
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 0
    schedule: str = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    optimizer: str = "adamw"
    # Optimiser switch (BLD): from update `optimizer_switch_step` on, use `optimizer_after_switch`.
    optimizer_switch_step: int | None = None
    optimizer_after_switch: str | None = None
    # Muon: None -> same lr as AdamW, which is what "match_rms_adamw" scaling is designed for.
    muon_lr: float | None = None
    muon_momentum: float = 0.95
    muon_adjust_lr: str = "match_rms_adamw"
    # regex (re.search on the parameter name) -> lr multiplier; a parameter may match at most one.
    lr_multipliers: dict[str, float] = field(default_factory=dict)
    # Parameters with ndim < 2 never get weight decay; these regexes exclude more by name.
    no_decay_patterns: tuple[str, ...] = ("norm", r"(^|\.)bias$", "A_log", "dt_bias")
    # 2-D parameters matching these (or owned by nn.Embedding) stay in AdamW when Muon is used.
    muon_exclude_patterns: tuple[str, ...] = ("embed", "lm_head", "wte", "wpe")
    seed: int = 0
    log_every: int = 10
    eval_every: int | None = None
    ckpt_every: int | None = None
    keep_last_k: int = 2
    # The checkpoint written after the last update: "full" (weights + optimiser state, like every other) or
    # "weights" (the model only: nothing is left to resume but publishing, so the optimiser state is dropped).
    final_checkpoint: str = "full"
    precision: str = "auto"
    device: str = "auto"
    progress: bool = True
    # Recompute each decoder layer in backward (memory for compute; the trajectory is unchanged).
    activation_checkpointing: bool = False
    # FSDP2 sharding: "auto" under torchrun with several processes; "always" in one process too (a group of
    # one: the multi-GPU code path, bf16 parameters under precision bf16, on one device).
    fsdp: str = "auto"

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # YAML gives lists
        self.no_decay_patterns = tuple(self.no_decay_patterns)
        self.muon_exclude_patterns = tuple(self.muon_exclude_patterns)
        self.lr_multipliers = dict(self.lr_multipliers)
        problems = _problems(self)
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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _problems(c: TrainConfig) -> list[str]:
    p: list[str] = []

    def pos_int(name: str, allow_none: bool = False, allow_zero: bool = False) -> None:
        v = getattr(c, name)
        if v is None and allow_none:
            return
        lo = 0 if allow_zero else 1
        if not _is_int(v) or v < lo:
            p.append(f"{name}={v!r}: must be an integer >= {lo}" + (" or null" if allow_none else ""))

    if not isinstance(c.out_dir, str) or not c.out_dir:
        p.append(f"out_dir={c.out_dir!r}: must be a non-empty path string")
    if (c.steps is None) == (c.token_budget is None):
        p.append("steps/token_budget: set exactly one of them (a step count or a token budget)")
    pos_int("steps", allow_none=True)
    pos_int("token_budget", allow_none=True)
    pos_int("seq_len", allow_none=True)
    if c.token_budget is not None and c.seq_len is None:
        p.append("seq_len=None: required with token_budget (tokens per sequence)")
    pos_int("micro_batch_size")
    pos_int("grad_accum")
    if not _is_num(c.lr) or c.lr <= 0:
        p.append(f"lr={c.lr!r}: must be a finite number > 0")
    if not _is_num(c.min_lr_ratio) or not 0 <= c.min_lr_ratio <= 1:
        p.append(f"min_lr_ratio={c.min_lr_ratio!r}: must be in [0, 1] (final lr = lr * min_lr_ratio)")
    pos_int("warmup_steps", allow_zero=True)
    if _is_int(c.warmup_steps) and c.steps is not None and _is_int(c.steps) and c.warmup_steps > c.steps:
        p.append(f"warmup_steps={c.warmup_steps}: longer than steps={c.steps}; shorten the warmup")
    if c.schedule not in SCHEDULES:
        p.append(f"schedule={c.schedule!r}: must be one of {SCHEDULES}")
    if not _is_num(c.weight_decay) or c.weight_decay < 0:
        p.append(f"weight_decay={c.weight_decay!r}: must be a finite number >= 0")
    if len(c.betas) != 2 or not all(_is_num(b) and 0 <= b < 1 for b in c.betas):
        p.append(f"betas={c.betas!r}: must be two numbers in [0, 1)")
    if not _is_num(c.eps) or c.eps <= 0:
        p.append(f"eps={c.eps!r}: must be a finite number > 0")
    if c.grad_clip is not None and (not _is_num(c.grad_clip) or c.grad_clip <= 0):
        p.append(f"grad_clip={c.grad_clip!r}: must be > 0, or null to disable clipping")
    if c.optimizer not in OPTIMIZERS:
        p.append(f"optimizer={c.optimizer!r}: must be one of {OPTIMIZERS}")
    if (c.optimizer_switch_step is None) != (c.optimizer_after_switch is None):
        p.append("optimizer_switch_step/optimizer_after_switch: set both (a step and an optimizer) or neither")
    pos_int("optimizer_switch_step", allow_none=True, allow_zero=True)
    if c.optimizer_after_switch is not None and c.optimizer_after_switch not in OPTIMIZERS:
        p.append(f"optimizer_after_switch={c.optimizer_after_switch!r}: must be one of {OPTIMIZERS}")
    if c.muon_lr is not None and (not _is_num(c.muon_lr) or c.muon_lr <= 0):
        p.append(f"muon_lr={c.muon_lr!r}: must be > 0, or null to reuse lr")
    if not _is_num(c.muon_momentum) or not 0 <= c.muon_momentum < 1:
        p.append(f"muon_momentum={c.muon_momentum!r}: must be in [0, 1)")
    if c.muon_adjust_lr not in MUON_ADJUST_LR:
        p.append(f"muon_adjust_lr={c.muon_adjust_lr!r}: must be one of {MUON_ADJUST_LR}")
    for pat, mult in c.lr_multipliers.items():
        if not _valid_regex(pat):
            p.append(f"lr_multipliers[{pat!r}]: not a valid regular expression")
        if not _is_num(mult) or mult <= 0:
            p.append(f"lr_multipliers[{pat!r}]={mult!r}: multiplier must be a finite number > 0")
    for name in ("no_decay_patterns", "muon_exclude_patterns"):
        for pat in getattr(c, name):
            if not _valid_regex(pat):
                p.append(f"{name}: {pat!r} is not a valid regular expression")
    pos_int("seed", allow_zero=True)
    pos_int("log_every")
    pos_int("eval_every", allow_none=True)
    pos_int("ckpt_every", allow_none=True)
    pos_int("keep_last_k")
    if c.final_checkpoint not in FINAL_CHECKPOINTS:
        p.append(f"final_checkpoint={c.final_checkpoint!r}: must be one of {FINAL_CHECKPOINTS}")
    if c.fsdp not in FSDP:
        p.append(f"fsdp={c.fsdp!r}: must be one of {FSDP}")
    if c.precision not in PRECISIONS:
        p.append(f"precision={c.precision!r}: must be one of {PRECISIONS}")
    if c.device not in DEVICES:
        p.append(f"device={c.device!r}: must be one of {DEVICES}")
    if not isinstance(c.progress, bool):
        p.append(f"progress={c.progress!r}: must be true or false")
    return p


def _valid_regex(pat: Any) -> bool:
    if not isinstance(pat, str):
        return False
    try:
        re.compile(pat)
    except re.error:
        return False
    return True
