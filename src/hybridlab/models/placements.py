"""Placements of full-attention (FA) layers in a hybrid stack.

A hybrid of L layers keeps n = round_half_up(L * ratio) FA layers; every other layer is a recurrent
mixer. The papers name the schemes but publish no indices, so these definitions are this project's:

- ``standard_periodic``: the LAST layer of each of n blocks (36/9 -> 3, 7, ..., 35).
- ``reverse_periodic``: the FIRST layer of each of n blocks (36/9 -> 0, 4, ..., 32).
- ``sandwich``: the first ceil(n/2) and the last floor(n/2) layers (36/9 -> 0-4, 32-35).
- ``interleaved_sandwich``: ceil(n/2) FA layers at every other layer from the start and floor(n/2)
  from the end (36/9 -> 0, 2, 4, 6, 8, 29, 31, 33, 35).
- ``endpoint_spread``: round_half_up(linspace(0, L-1, n)) (36/9 -> 0, 4, 9, 13, 18, 22, 26, 31, 35).
- ``explicit``: a user-given index list (validated: in range, no duplicates).
- ``searched`` / ``searched_<group>``: the n layers with the highest measured importance for all
  languages / one language group (``hybridlab.eval.layer_importance``); ``top_layers`` picks them from
  the scores, so these schemes need the importance table rather than a ratio alone.
- ``all_mixers``: no FA layer at all; the student whose stage-1 mixers the importance pass swaps in
  one layer at a time (never a distillation arm).

Blocks when L is not divisible by n: block i spans [b_i, b_{i+1}) with boundaries
b_i = round_half_up(i * L / n), so blocks have sizes floor(L/n) or ceil(L/n), spread evenly
(e.g. 10/3 -> boundaries 0, 3, 7, 10 -> blocks of 3, 4, 3). With L divisible by n this is exactly
"blocks of L/n". All roundings are half-up and done in exact integer arithmetic, so no float
banker's rounding or representation error can move a layer.

Layer types follow transformers' ``config.layer_types`` vocabulary: ``"full_attention"`` for FA
layers and the mixer kind (e.g. ``"gdn"``) for the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from hybridlab.data.languages import SEARCH_GROUPS
from hybridlab.errors import HybridlabError

PLACEMENTS: tuple[str, ...] = (
    "standard_periodic",
    "reverse_periodic",
    "sandwich",
    "interleaved_sandwich",
    "endpoint_spread",
)
EXPLICIT = "explicit"
ALL_MIXERS = "all_mixers"
FULL_ATTENTION = "full_attention"


def searched_group(placement: str) -> str | None:
    """The language group a searched placement is chosen for ("searched" -> "all", "searched_<g>" -> g); None for a
    placement that is not searched."""
    if placement == "searched":
        return "all"
    group = placement.removeprefix("searched_")
    return group if group != placement and group in SEARCH_GROUPS[1:] else None


def top_layers(scores: Sequence[float], n: int) -> list[int]:
    """Sorted indices of the `n` highest scores (a tie goes to the lower layer index)."""
    if not 1 <= n <= len(scores):
        raise HybridlabError(f"cannot choose {n} layers from {len(scores)} importance scores")
    bad = [i for i, s in enumerate(scores) if not math.isfinite(float(s))]
    if bad:
        raise HybridlabError(f"importance scores of layers {bad} are not finite; rerun the importance pass")
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return sorted(order[:n])


def _round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


def num_fa_layers(num_layers: int, ratio: float) -> int:
    """n = round_half_up(num_layers * ratio); raises if that gives 0 or more than num_layers layers."""
    if not 0.0 < ratio <= 1.0:
        raise HybridlabError(f"FA ratio {ratio} is outside (0, 1]; give the fraction of full-attention layers, e.g. 0.25")
    # Fraction(str(...)) reads 0.1 as 1/10 rather than its binary approximation.
    n = _round_half_up(num_layers * Fraction(str(ratio)))
    if n == 0:
        raise HybridlabError(
            f"FA ratio {ratio} of {num_layers} layers rounds to 0 full-attention layers; raise the ratio to at least "
            f"{1 / (2 * num_layers):.4g} or use scheme 'explicit'"
        )
    return n


def _block_boundaries(num_layers: int, n: int) -> list[int]:
    return [_round_half_up(Fraction(i * num_layers, n)) for i in range(n + 1)]


def _standard_periodic(num_layers: int, n: int) -> list[int]:
    return [b - 1 for b in _block_boundaries(num_layers, n)[1:]]


def _reverse_periodic(num_layers: int, n: int) -> list[int]:
    return _block_boundaries(num_layers, n)[:-1]


def _sandwich(num_layers: int, n: int) -> list[int]:
    head, tail = math.ceil(n / 2), n // 2
    return list(range(head)) + list(range(num_layers - tail, num_layers))


def _interleaved_or_none(num_layers: int, n: int) -> list[int] | None:
    head, tail = math.ceil(n / 2), n // 2
    first = [2 * i for i in range(head)]
    last = [num_layers - 1 - 2 * i for i in reversed(range(tail))]
    if first[-1] >= num_layers or (last and first[-1] >= last[0]):
        return None  # the two combs would collide or run off the stack
    return first + last


def _interleaved_sandwich(num_layers: int, n: int) -> list[int]:
    idx = _interleaved_or_none(num_layers, n)
    if idx is None:
        max_n = max(m for m in range(1, num_layers + 1) if _interleaved_or_none(num_layers, m) is not None)
        raise HybridlabError(
            f"interleaved_sandwich cannot place {n} FA layers at every other layer of {num_layers} layers "
            f"(at most {max_n}); lower the ratio or use another scheme"
        )
    return idx


def _endpoint_spread(num_layers: int, n: int) -> list[int]:
    if n == 1:
        return [0]
    return [_round_half_up(Fraction(i * (num_layers - 1), n - 1)) for i in range(n)]


_SCHEMES = {
    "standard_periodic": _standard_periodic,
    "reverse_periodic": _reverse_periodic,
    "sandwich": _sandwich,
    "interleaved_sandwich": _interleaved_sandwich,
    "endpoint_spread": _endpoint_spread,
}


def _validate_explicit(num_layers: int, indices: Sequence[int]) -> list[int]:
    idx = [int(i) for i in indices]
    bad = [i for i in idx if not 0 <= i < num_layers]
    if bad:
        raise HybridlabError(f"FA layer indices {bad} are out of range for {num_layers} layers; use 0..{num_layers - 1}")
    dupes = sorted({i for i in idx if idx.count(i) > 1})
    if dupes:
        raise HybridlabError(f"FA layer indices {dupes} are repeated; list each full-attention layer once")
    return sorted(idx)


def fa_layers(
    scheme: str,
    num_layers: int,
    ratio: float | None = None,
    indices: Sequence[int] | None = None,
) -> list[int]:
    """Sorted indices of the full-attention layers for a named scheme (with ratio) or 'explicit' (with indices)."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise HybridlabError(f"num_layers must be a positive integer, got {num_layers!r}")
    if scheme == ALL_MIXERS:
        return []
    if searched_group(scheme) is not None:
        raise HybridlabError(f"placement {scheme!r} is chosen from measured layer importance; give its layers "
                             "with top_layers(scores, n) (convert_student.py reads them from --importance)")
    if scheme == EXPLICIT:
        if indices is None:
            raise HybridlabError("placement scheme 'explicit' needs `indices` (a list of FA layer indices)")
        if ratio is not None:
            raise HybridlabError("placement scheme 'explicit' takes `indices` only; drop `ratio`")
        return _validate_explicit(num_layers, indices)
    if scheme not in _SCHEMES:
        allowed = ", ".join((*PLACEMENTS, EXPLICIT))
        raise HybridlabError(f"unknown placement scheme {scheme!r}; use one of: {allowed}")
    if indices is not None:
        raise HybridlabError(f"placement scheme {scheme!r} takes `ratio`, not `indices`; use scheme 'explicit' for a list")
    if ratio is None:
        raise HybridlabError(f"placement scheme {scheme!r} needs `ratio` (fraction of full-attention layers, e.g. 0.25)")
    n = num_fa_layers(num_layers, ratio)
    return sorted(_SCHEMES[scheme](num_layers, n))


def layer_types(
    scheme: str,
    num_layers: int,
    ratio: float | None = None,
    indices: Sequence[int] | None = None,
    mixer_kind: str = "gdn",
) -> list[str]:
    """Per-layer types: "full_attention" at the scheme's FA layers, `mixer_kind` elsewhere."""
    fa = set(fa_layers(scheme, num_layers, ratio=ratio, indices=indices))
    return [FULL_ATTENTION if i in fa else mixer_kind for i in range(num_layers)]


def placement_diagram(types: Sequence[str]) -> str:
    """One character per layer: 'A' full attention, 'S' sliding-window attention, '.' any recurrent mixer."""
    symbol = {FULL_ATTENTION: "A", "sliding_attention": "S"}
    return "".join(symbol.get(t, ".") for t in types)
