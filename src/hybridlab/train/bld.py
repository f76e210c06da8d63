"""Better Layer Division (BLD) plans: which parameters freeze when, and when the optimiser switches.

BLD (competing-learning study) gives full attention a head start on retrieval by freezing the
recurrent layers of a hybrid early in training. This module turns an *arm* (a named freezing recipe)
into the pieces the shared loop consumes; it is model-generic and used by the Spaced Retrieval and the
natural-language BLD trainers alike.

Definitions:

- **Layer sites.** Decoder layers are located generically (`hybridlab.models.sites`): layer i lives
  at `<prefix>.<i>` (e.g. `model.layers.3`) and has one token-mixer child (`self_attn` for dense
  layers and for converted hybrids, whose `MixerAttention` wrapper replaces `self_attn`).
- **Layer kind.** `"full_attention"`, `"sliding_attention"` or a recurrent kind (`"kda"`, `"gdn"`,
  ...): from the hybrid spec of a converted model, else the config's `layer_types` (native hybrids),
  else the mixer module's own kind, else `"full_attention"` for a dense layer.
- **Recurrent layer.** Decided by a predicate on the `LayerSite`; the default calls every kind other
  than full / sliding attention recurrent.
- **Scope.** `"mixer"` freezes the parameters of the recurrent layers' token mixer only
  (`<prefix>.<i>.self_attn.*`); `"block"` freezes the whole decoder layer (mixer, norms, MLP).
- **Windows.** An arm lists windows `(start, end)` as *fractions of the total update count N*; they
  become update windows `[round(start*N), max(start_step + 1, round(end*N)))` (half-up rounding,
  at least one update long, `end=None`: frozen until the end). `(0, s)` is BLD's frozen start,
  `(s, s + w)` a window in the middle. An arm may also list `update_windows`, `(start, end)` in
  updates, taken as they are (the study states its freeze points as step counts, so a freeze before
  the retrieval takeover is the same update count at any run length); a window must start before N
  and end by N. The layers are frozen during update `u` iff `u` is in a window
  (see `hybridlab.train.freeze.FreezeSchedule`; step numbering as in `hybridlab.train.config`).
- **Optimiser switch.** With `optimizer_after_unfreeze` set, the loop switches optimiser family at
  the end of the last bounded window (the update at which the recurrent layers are released, as in
  BLD's AdamW -> Muon recipe). An arm without windows (the baseline) has no switch; a trainer that
  wants the baseline to switch at the same step passes `switch_step` explicitly.
- **Gradient-norm groups.** `grad_norm_groups(model)` names one group per layer (`layer<i>/<kind>`)
  and one per kind (`<kind>`), each covering the layer's token-mixer parameters, for the loop's
  `grad_norm_groups` (logged pre-clip as `grad_norm/<group>`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.train.arms import windows_to_steps
from hybridlab.train.freeze import FreezeSchedule

SCOPES = ("mixer", "block")
ATTENTION_KINDS = ("full_attention", "sliding_attention")
OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class LayerSite:
    """One decoder layer: index, kind and the parameter-name prefixes of the block and its mixer."""

    index: int
    kind: str
    block_prefix: str  # e.g. "model.layers.3."
    mixer_prefix: str  # e.g. "model.layers.3.self_attn."
    module: nn.Module = field(repr=False, compare=False)


@dataclass(frozen=True)
class FreezeArm:
    """A named freezing recipe; windows are (start, end) fractions of training (end None = to the end),
    update_windows (start, end) update counts."""

    name: str
    windows: tuple[tuple[float, float | None], ...] = ()
    scope: str = "block"
    optimizer_after_unfreeze: str | None = None
    update_windows: tuple[tuple[int, int | None], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "windows", tuple((float(s), None if e is None else float(e)) for s, e in self.windows))
        for w in self.update_windows:
            s, e = w
            if (not isinstance(s, int) or isinstance(s, bool) or s < 0
                    or (e is not None and (not isinstance(e, int) or isinstance(e, bool) or e <= s))):
                raise HybridlabError(
                    f"BLD arm {self.name!r}: update window {list(w)} must be whole updates with 0 <= start < end "
                    "(end null = until the end)")
        object.__setattr__(self, "update_windows", tuple((s, e) for s, e in self.update_windows))
        if self.scope not in SCOPES:
            raise HybridlabError(f"BLD arm {self.name!r}: scope={self.scope!r}; use one of {SCOPES}")
        if self.optimizer_after_unfreeze is not None and self.optimizer_after_unfreeze not in OPTIMIZERS:
            raise HybridlabError(
                f"BLD arm {self.name!r}: optimizer_after_unfreeze={self.optimizer_after_unfreeze!r}; "
                f"use one of {OPTIMIZERS} or null"
            )
        for s, e in self.windows:
            if not 0 <= s < 1 or (e is not None and not s < e <= 1):
                raise HybridlabError(
                    f"BLD arm {self.name!r}: freeze window ({s:g}, {e}) must satisfy 0 <= start < end <= 1 "
                    "(fractions of the training steps; end null = until the end)"
                )


@dataclass
class BLDPlan:
    """What a trainer hands to the loop for one arm."""

    arm: FreezeArm
    total_steps: int
    windows: list[tuple[int, int | None]]  # update windows
    recurrent_layers: list[int]
    frozen_names: list[str]
    schedules: list[FreezeSchedule]  # on_step_start hooks (empty for an arm without windows)
    optimizer_switch_step: int | None
    optimizer_after_switch: str | None

    def train_config_overrides(self) -> dict:
        """TrainConfig fields for the optimiser switch ({} when the arm has none)."""
        if self.optimizer_switch_step is None:
            return {}
        return {"optimizer_switch_step": self.optimizer_switch_step, "optimizer_after_switch": self.optimizer_after_switch}

    def frozen_at(self, step: int) -> bool:
        return any(s <= step and (e is None or step < e) for s, e in self.windows)


def arm_update_windows(arm: FreezeArm, total_steps: int) -> list[tuple[int, int | None]]:
    """Every update window of `arm` in a run of `total_steps` updates: its fraction windows
    (`windows_to_steps`) then its update windows, which must start before and end by `total_steps`."""
    out = windows_to_steps(arm.windows, total_steps)
    for s, e in arm.update_windows:
        if s >= total_steps or (e is not None and e > total_steps):
            raise HybridlabError(
                f"BLD arm {arm.name!r}: update window [{s}, {e}) does not fit a run of {total_steps} updates; "
                "start it earlier, shorten it or train longer")
        out.append((s, e))
    return out


def layer_sites(model: nn.Module) -> list[LayerSite]:
    """The decoder layers of `model` with their kinds and parameter-name prefixes."""
    from hybridlab.models.sites import find_decoder_layers, find_mixer_sites

    sites = find_mixer_sites(model)
    prefix, layers = find_decoder_layers(model)
    kinds = _layer_kinds(model, layers, sites)
    return [
        LayerSite(i, kinds[i], f"{prefix}.{i}.", f"{prefix}.{i}.{site.mixer_name}.", layers[i])
        for i, site in enumerate(sites)
    ]


def _layer_kinds(model: nn.Module, layers: nn.ModuleList, sites) -> list[str]:
    from hybridlab.models.convert import MixerAttention
    from hybridlab.models.mixers import RecurrentMixer

    spec = getattr(model, "hybridlab_spec", None)
    if spec is not None:
        return list(spec.layer_types)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    types = getattr(config, "layer_types", None)
    kinds = []
    for i, site in enumerate(sites):
        mixer = getattr(layers[i], site.mixer_name)
        if isinstance(mixer, MixerAttention):
            kinds.append(mixer.kind)
        elif isinstance(mixer, RecurrentMixer):
            kinds.append(mixer.cfg.kind)
        elif types is not None and len(types) == len(sites):
            kinds.append(str(types[i]))
        elif site.mixer_name in ("self_attn", "attention", "self_attention", "attn"):
            kinds.append("full_attention")
        else:
            kinds.append(site.mixer_name)  # e.g. "mamba", "linear_attn": recurrent by the default predicate
    return kinds


def default_recurrent(site: LayerSite) -> bool:
    return site.kind not in ATTENTION_KINDS


def plan_bld(
    model: nn.Module,
    arm: FreezeArm,
    total_steps: int,
    recurrent: Callable[[LayerSite], bool] = default_recurrent,
    switch_step: int | None = None,
) -> BLDPlan:
    """Freeze schedules and optimiser switch of `arm` for a run of `total_steps` updates of `model`."""
    sites = layer_sites(model)
    rec = [s for s in sites if recurrent(s)]
    windows = arm_update_windows(arm, total_steps)
    if windows and not rec:
        raise HybridlabError(
            f"BLD arm {arm.name!r} freezes recurrent layers but the model has none (layer kinds "
            f"{[s.kind for s in sites]}); convert it to a hybrid or fix the recurrent predicate"
        )
    prefixes = tuple(s.block_prefix if arm.scope == "block" else s.mixer_prefix for s in rec)
    names = [n for n, _ in model.named_parameters() if n.startswith(prefixes)]
    schedules = [FreezeSchedule(names, windows)] if windows else []
    if switch_step is None and arm.optimizer_after_unfreeze is not None:
        bounded = [e for _, e in windows if e is not None]
        switch_step = max(bounded) if bounded else None
    if switch_step is not None and not 0 <= switch_step < total_steps:
        raise HybridlabError(f"optimizer switch at update {switch_step} is outside the run of {total_steps} updates")
    after = arm.optimizer_after_unfreeze if switch_step is not None else None
    if switch_step is not None and after is None:
        raise HybridlabError(f"BLD arm {arm.name!r}: switch_step given but optimizer_after_unfreeze is not set")
    return BLDPlan(arm, total_steps, windows, [s.index for s in rec], names, schedules, switch_step, after)


def grad_norm_groups(model: nn.Module) -> dict[str, Callable[[str], bool]]:
    """Per-layer (`layer<i>/<kind>`) and per-kind (`<kind>`) groups of token-mixer parameters."""
    sites = layer_sites(model)
    groups: dict[str, Callable[[str], bool]] = {}
    for s in sites:
        groups[f"layer{s.index}/{s.kind}"] = lambda n, p=s.mixer_prefix: n.startswith(p)
    for kind in sorted({s.kind for s in sites}):
        prefixes = tuple(s.mixer_prefix for s in sites if s.kind == kind)
        groups[kind] = lambda n, p=prefixes: n.startswith(p)
    return groups
