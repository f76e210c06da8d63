"""The arms of each training experiment, derived from its `experiments.<name>` config section.

Plain data, no torch: the Snakefile reads it at every parse to create one job per arm and seed, and the
training code reads the same specs (`hybridlab.train.spaced_retrieval.SRArm.from_dict`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from hybridlab.errors import HybridlabError

# BLD on natural language (hybridlab.train.bld_nl): layer kinds of `experiments.bld_nl.pattern`, arm variants.
FULL_ATTENTION = "full_attention"
MIXER = "mixer"
VARIANTS = ("baseline", "bld")


def _round_half_up(x: Fraction) -> int:
    return int((x + Fraction(1, 2)).__floor__())


def windows_to_steps(windows: Sequence[tuple[float, float | None]], total_steps: int) -> list[tuple[int, int | None]]:
    """Fraction windows -> update windows (`hybridlab.train.bld`, "Windows"); exact rational arithmetic."""
    if total_steps < 1:
        raise HybridlabError(f"total_steps={total_steps} must be >= 1")
    out = []
    for s, e in windows:
        start = _round_half_up(Fraction(str(s)) * total_steps)
        if start >= total_steps:
            raise HybridlabError(
                f"freeze window ({s:g}, {e}) starts at update {start} of {total_steps}; it never freezes anything, "
                "start it earlier or train longer"
            )
        end = None if e is None else max(start + 1, _round_half_up(Fraction(str(e)) * total_steps))
        out.append((start, end))
    return out


_SR_FREEZE_NAMES = (  # (pattern, unit) of the freeze arm names `sr_arm_specs` gives
    (re.compile(r"freeze0-(\d+)u"), "updates"), (re.compile(r"window(\d+)u\+(\d+)u"), "updates"),
    (re.compile(r"freeze0-([0-9.e-]+)"), "fraction"), (re.compile(r"window([0-9.e-]+)\+([0-9.e-]+)"), "fraction"))


def sr_arm_windows(name: str, total_steps: int) -> list[tuple[int, int]] | None:
    """The update windows [start, end) of the Spaced Retrieval freeze arm called `name` (a name from
    `sr_arm_specs`) in a run of `total_steps` updates; None for an arm that freezes nothing (baseline,
    long-gap arms)."""
    for pattern, unit in _SR_FREEZE_NAMES:
        m = pattern.fullmatch(name)
        if m is None:
            continue
        nums = [float(x) for x in m.groups()]
        start, end = (0.0, nums[0]) if len(nums) == 1 else (nums[0], nums[0] + nums[1])
        if unit == "updates":
            return [(int(start), int(end))]
        return windows_to_steps([(start, round(end, 12))], total_steps)
    return None


def sr_arm_specs(experiment: dict) -> dict[str, dict]:
    """Every arm of the Spaced Retrieval study from `experiments.bld_sr`: {name: spec for `SRArm.from_dict`}.

    The baseline, one arm per `freeze_until` fraction (frozen from the start), one per `freeze_windows`
    [start, width] pair (fractions of training), the same two kinds in updates (`freeze_until_updates`:
    `freeze0-<s>u`, `freeze_windows_updates`: `window<s>u+<w>u`) and one per `long_gap_fractions` value
    (long-gap resampling, no freezing); windows are [start, end]. The rules derive one job per arm (and
    seed) from these names.
    """
    e = experiment
    specs: dict[str, dict] = {"baseline": {"windows": []}}
    specs.update({f"freeze0-{s:g}": {"windows": [[0, s]]} for s in e["freeze_until"]})
    # round(): 0.2 + 0.1 must be 0.3, not 0.30000000000000004 (which could pass 1.0 at the end)
    specs.update({f"window{s:g}+{w:g}": {"windows": [[s, round(s + w, 12)]]} for s, w in e["freeze_windows"]})
    specs.update({f"freeze0-{s}u": {"windows": [], "update_windows": [[0, s]]}
                  for s in e.get("freeze_until_updates") or []})
    specs.update({f"window{s}u+{w}u": {"windows": [], "update_windows": [[s, s + w]]}
                  for s, w in e.get("freeze_windows_updates") or []})
    specs.update({f"longgap{f:g}": {"windows": [], "long_gap_fraction": f} for f in e["long_gap_fractions"]})
    common = {"scope": e["freeze_scope"], "optimizer_after_unfreeze": e["optimizer_after_unfreeze"]}
    return {name: {"name": name, **common, **spec} for name, spec in specs.items()}


def sr_score_points(experiment: dict) -> tuple[list[float], list[int]]:
    """(fractions, updates) of the score checkpoints every Spaced Retrieval arm saves: `score_fractions` and
    `score_updates`, plus the end of each arm's bounded freeze windows (the model after the window's last
    frozen update), in the window's own unit. Every arm, the baseline included, saves them all, so the
    retrieval score at the end of a freeze is compared with the other arms at the same step."""
    fractions = set(experiment["score_fractions"])
    updates = set(experiment.get("score_updates") or [])
    for spec in sr_arm_specs(experiment).values():
        fractions |= {end for _, end in spec.get("windows", []) if end is not None}
        updates |= {end for _, end in spec.get("update_windows", []) if end is not None}
    return sorted(fractions), sorted(updates)


@dataclass(frozen=True)
class NLArm:
    """One training run: a mixer kind, a size name and a variant (baseline or bld)."""

    name: str
    mixer: str
    size: str
    variant: str


def nl_arms(mixers: Sequence[str], sizes: Sequence[str]) -> list[NLArm]:
    """Every arm of the study, sizes outermost; the size is in the name only when there are several."""
    if not mixers or not sizes:
        raise HybridlabError("bld_nl needs at least one mixer (experiments.bld_nl.mixers) and one size "
                             "(train.bld_nl.sizes)")
    multi = len(sizes) > 1
    return [NLArm(f"{m}-{s}-{v}" if multi else f"{m}-{v}", m, s, v) for s in sizes for m in mixers for v in VARIANTS]


def layer_kinds(pattern: Sequence[str], num_layers: int) -> list[str]:
    """`pattern` repeated over `num_layers` layers ("full_attention" / "mixer" per layer)."""
    bad = sorted(set(pattern) - {FULL_ATTENTION, MIXER})
    if not pattern or bad:
        raise HybridlabError(f"bld_nl pattern {list(pattern)} must be a non-empty list of "
                             f"'{FULL_ATTENTION}' and '{MIXER}'")
    if num_layers % len(pattern):
        raise HybridlabError(f"num_hidden_layers={num_layers} is not a multiple of the pattern length "
                             f"{len(pattern)}; choose a layer count that repeats the pattern whole")
    kinds = [pattern[i % len(pattern)] for i in range(num_layers)]
    if FULL_ATTENTION not in kinds or MIXER not in kinds:
        raise HybridlabError(f"bld_nl pattern {list(pattern)} needs at least one '{FULL_ATTENTION}' and one "
                             f"'{MIXER}' layer for a hybrid")
    return kinds


def check_study(experiment: dict, run: dict) -> None:
    """Config checks the JSON schema cannot express (called when the DAG is built)."""
    for name, shape in run["sizes"].items():
        where = f"train.bld_nl.sizes.{name}"
        if shape["num_attention_heads"] % shape["num_key_value_heads"]:
            raise HybridlabError(f"{where}: num_attention_heads must be a multiple of num_key_value_heads")
        try:
            layer_kinds(experiment["pattern"], shape["num_hidden_layers"])
        except HybridlabError as exc:
            raise HybridlabError(f"{where}: {exc}") from None
    if ("steps" in run) == ("tokens_per_param" in run):
        raise HybridlabError("train.bld_nl: set exactly one of steps and tokens_per_param")
