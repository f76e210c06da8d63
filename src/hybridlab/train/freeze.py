"""Step-windowed parameter freezing (Better Layer Division, BLD).

`FreezeSchedule(select, windows)` freezes the selected parameters during update `step` iff
`start <= step < end` for one of the windows (`end=None`: frozen until the end of training).
`[(0, s)]` freezes the first s updates then unfreezes (BLD's head start for attention);
`[(s, s + w)]` freezes for a window in the middle.

`select` is one of
- a regex string, matched with re.search against parameter names (e.g. r"\\.linear_attn\\." for the
  mixer sub-modules only, or r"layers\\.(1|2|4)\\." for whole blocks);
- a callable `name -> bool`;
- an explicit collection of parameter names (unknown names are an error).

Freezing sets `requires_grad=False`. The loop clears gradients with `set_to_none=True`, so frozen
parameters have `.grad is None`, which torch's AdamW and Muon skip entirely: frozen weights stay
bitwise unchanged (no update, no weight decay) and their optimiser state (step count, moments,
momentum) does not advance. The schedule is a pure function of the step, so resuming in the
middle of a window needs no saved state. Parameters that were already `requires_grad=False` when
the schedule first saw the model stay frozen outside the windows too. Use one schedule per
disjoint selection: two schedules selecting the same parameter would overrule each other.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Sequence

from torch import nn

from hybridlab.errors import HybridlabError

Selector = str | Callable[[str], bool] | Iterable[str]


class FreezeSchedule:
    def __init__(self, select: Selector, windows: Sequence[tuple[int, int | None]]):
        self.windows = _check_windows(windows)
        self._names: frozenset[str] | None = None
        if isinstance(select, str):
            rx = re.compile(select)
            self._pred: Callable[[str], bool] = lambda n: rx.search(n) is not None
        elif callable(select):
            self._pred = select
        else:
            self._names = frozenset(select)
            self._pred = lambda n: n in self._names  # type: ignore[operator]
        self._trainable: dict[str, bool] | None = None  # requires_grad before the first apply

    def frozen_at(self, step: int) -> bool:
        return any(s <= step and (e is None or step < e) for s, e in self.windows)

    def selected(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        named = list(model.named_parameters())
        if self._names is not None:
            unknown = sorted(self._names - {n for n, _ in named})
            if unknown:
                raise HybridlabError(f"FreezeSchedule names unknown parameters {unknown[:5]}; check the names")
        chosen = [(n, p) for n, p in named if self._pred(n)]
        if not chosen:
            raise HybridlabError("FreezeSchedule selects no parameter; fix the selector (pattern or names)")
        return chosen

    def apply(self, step: int, model: nn.Module) -> bool:
        """Set requires_grad of the selected parameters for update `step`; returns whether frozen."""
        chosen = self.selected(model)
        if self._trainable is None:
            self._trainable = {n: p.requires_grad for n, p in chosen}
        frozen = self.frozen_at(step)
        for n, p in chosen:
            p.requires_grad_(self._trainable[n] and not frozen)
        return frozen

    def __call__(self, step: int, model: nn.Module, optimizer: Any = None) -> None:
        """The `on_step_start(step, model, optimizer)` hook form."""
        self.apply(step, model)


def _check_windows(windows: Sequence[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
    out = []
    for w in windows:
        if len(w) != 2:
            raise HybridlabError(f"freeze window {w!r} must be a pair (start, end)")
        s, e = w
        if not isinstance(s, int) or s < 0 or (e is not None and (not isinstance(e, int) or e <= s)):
            raise HybridlabError(f"freeze window {w!r} must have 0 <= start < end (end may be null)")
        out.append((s, e))
    out.sort(key=lambda w: w[0])
    for (s0, e0), (s1, _) in zip(out, out[1:]):
        if e0 is None or e0 > s1:
            raise HybridlabError(f"freeze windows {out} overlap; merge them")
    if not out:
        raise HybridlabError("FreezeSchedule needs at least one (start, end) window")
    return out
