"""Training metrics: gradient norms and the `metrics.parquet` log.

- `grad_norm(params)`: L2 norm of all existing gradients taken together (parameters whose `.grad`
  is None, e.g. frozen ones, contribute nothing); 0.0 when there are none.
- `grad_norms_by_group(named_params, groups)`: the same norm restricted to the parameters whose
  name satisfies each predicate, e.g. `{"attn": lambda n: "self_attn" in n,
  "mixer": lambda n: "linear_attn" in n}` for BLD's per-mixer-type curves. Logged pre-clip as
  `grad_norm/<group>`.
- `MetricsLog`: one row per logged step (step, tokens, loss, lr, grad_norm, tokens_per_s, task
  scalars, `grad_norm/*`, `eval/*`), rewritten atomically (temp file + rename) on every flush. On
  resume, rows after the checkpoint's step (written by the killed run after its last checkpoint)
  are dropped so the resumed log equals an uninterrupted one. `tokens_per_s` is wall-clock and is
  the only column that differs between two otherwise identical runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

import polars as pl
import torch

from hybridlab.atomic import atomic_file
from hybridlab.errors import HybridlabError

NONDETERMINISTIC_COLUMNS = ("tokens_per_s",)


def grad_norm(params: Iterable[torch.Tensor]) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0)


def grad_norms_by_group(
    named_params: Iterable[tuple[str, torch.Tensor]], groups: dict[str, Callable[[str], bool]]
) -> dict[str, float]:
    named = list(named_params)
    return {g: float(grad_norm(p for n, p in named if pred(n))) for g, pred in groups.items()}


class MetricsLog:
    """Accumulates rows in memory and rewrites `path` atomically; inactive on non-zero ranks."""

    def __init__(self, path: str | Path, active: bool):
        self.path, self.active = Path(path), active
        self.rows: list[dict[str, Any]] = []

    def resume(self, upto_step: int) -> None:
        """Keep the rows of steps <= upto_step from an existing log (none if there is no file)."""
        self.rows = []
        if not self.active or not self.path.exists():
            return
        try:
            df = pl.read_parquet(self.path)
        except Exception as e:
            raise HybridlabError(
                f"metrics file {self.path} is unreadable ({' '.join(str(e).split())[:200]}); "
                "delete it (its rows are lost) or rerun with --restart"
            ) from e
        df = df.filter(pl.col("step") <= upto_step)
        # Columns that only had values in dropped rows must not survive as all-null columns.
        df = df.select([c for c in df.columns if df[c].null_count() < df.height])
        self.rows = df.to_dicts()

    def append(self, row: dict[str, Any]) -> None:
        if self.active:
            self.rows.append(row)

    def flush(self) -> None:
        if not self.active or not self.rows:
            return
        df = pl.from_dicts(self.rows, infer_schema_length=None)
        with atomic_file(self.path) as tmp:
            df.write_parquet(tmp)

    def frame(self) -> pl.DataFrame:
        return pl.from_dicts(self.rows, infer_schema_length=None) if self.rows else pl.DataFrame()
