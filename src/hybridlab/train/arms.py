"""The arms of each training experiment, derived from its `experiments.<name>` config section.

Plain data, no torch: the Snakefile reads it at every parse to create one job per arm and seed, and the
training code reads the same specs (`hybridlab.train.spaced_retrieval.SRArm.from_dict`).
"""

from __future__ import annotations


def sr_arm_specs(experiment: dict) -> dict[str, dict]:
    """Every arm of the Spaced Retrieval study from `experiments.bld_sr`: {name: spec for `SRArm.from_dict`}.

    The baseline, one arm per `freeze_until` fraction (frozen from the start), one per `freeze_windows`
    [start, width] pair and one per `long_gap_fractions` value (long-gap resampling, no freezing); windows are
    [start, end] fractions of training. The rules derive one job per arm (and seed) from these names.
    """
    e = experiment
    specs: dict[str, dict] = {"baseline": {"windows": []}}
    specs.update({f"freeze0-{s:g}": {"windows": [[0, s]]} for s in e["freeze_until"]})
    # round(): 0.2 + 0.1 must be 0.3, not 0.30000000000000004 (which could pass 1.0 at the end)
    specs.update({f"window{s:g}+{w:g}": {"windows": [[s, round(s + w, 12)]]} for s, w in e["freeze_windows"]})
    specs.update({f"longgap{f:g}": {"windows": [], "long_gap_fraction": f} for f in e["long_gap_fractions"]})
    common = {"scope": e["freeze_scope"], "optimizer_after_unfreeze": e["optimizer_after_unfreeze"]}
    return {name: {"name": name, **common, **spec} for name, spec in specs.items()}
