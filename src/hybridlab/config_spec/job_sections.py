"""The settings each pipeline job takes: one typed section per job, the JSON object its rule passes as
``--params``.

A rule builds its params from these fields (`job_keys`), the job builds and validates its section from
them (`hybridlab.config.job_settings`: an unknown or missing key, or a value of the wrong type, is one
line), and the script's ``--help`` prints the section (`describe_job`). Most fields are config sections
passed through whole (a distillation stage, a BLD run); the rest are what the rule adds for one job (the
replicate seed, the arm).
"""

from dataclasses import dataclass
from typing import Literal

from hybridlab.config_spec.data_sections import BldNlStream, Heldout, TeacherShape
from hybridlab.config_spec.fields import (
    UNSET, Lang, Mixer, NonNegInt, Optimizer, PosInt, UnitFloat, opt, req)
from hybridlab.config_spec.train_sections import BldNlRun, BldNlSize, BldSrTrain, DistillStage, Run
from hybridlab.config_spec.tree import BldNlArms, BldNlExperiment

_SEED = "the replicate seed: initial weights, data order"
_DOCUMENT_MASK = "document-masked training and evaluation (data.packing.document_mask)"
_KEEP = "checkpoints kept in the work directory (absent: TrainConfig's default)"
_FINAL = ("the checkpoint after the last update: full (with optimiser state) or weights (absent: full)")


@dataclass(kw_only=True)
class TeacherJob:
    """The teacher rule: pre-training from scratch (offline presets, pretrain_teacher.py), conversion of a
    GGUF file (convert_gguf_teacher.py) or the hub download (fetch_teacher.py)."""

    name: str = req("the teacher: a local name, or the hub id to download")
    shape: TeacherShape | None = req("the decoder's shape (offline presets; null at hub presets)")
    train: Run | None = req("pre-training settings (offline presets; null at hub presets)")
    seed: NonNegInt = req("initialisation and data order of pre-training")
    gguf: str = opt(UNSET, "a .gguf path, or package:<package>/<file> for a file an installed package ships "
                           "(absent: not a GGUF teacher)")
    document_mask: bool = opt(False, _DOCUMENT_MASK)


@dataclass(kw_only=True)
class _DistillJob:
    """What both distillation stages read (train.distill, without the other stage's settings)."""

    seed: NonNegInt = req(_SEED + " (the same for every placement of that seed)")
    eval_every_tokens: PosInt = req("training tokens between held-out CE/KL points (rounded to updates)")
    ckpt_every_tokens: PosInt = req("training tokens between checkpoints")
    eval_rows_per_language: PosInt = req("held-out rows per language for the curves")
    eval_batch_size: PosInt = req("rows per evaluation batch")
    gradient_checkpointing: bool = req("recompute each decoder layer in backward")
    teacher_sharding: Literal["replicate", "shard"] = opt(
        "replicate", "the frozen teacher on every rank (replicate) or FSDP-sharded over the ranks (shard)")
    keep_last_k: PosInt = opt(UNSET, _KEEP)
    final_checkpoint: Literal["full", "weights"] = opt(UNSET, _FINAL)
    document_mask: bool = opt(False, _DOCUMENT_MASK)


@dataclass(kw_only=True)
class DistillStage1Job(_DistillJob):
    """Distillation stage 1 (distill.py --stage 1): the new mixers align to the attention they replace."""

    stage1: DistillStage = req("the stage's run settings")
    stage1_inputs: Literal["teacher", "student"] = req(
        "inputs of mixer i: the teacher's attention input (RADLADS) or the student's own")


@dataclass(kw_only=True)
class DistillStage2Job(_DistillJob):
    """Distillation stage 2 (distill.py --stage 2): forward KL of the logits, the whole student trains."""

    stage2: DistillStage = req("the stage's run settings")
    kl_chunk_tokens: PosInt = req("positions per chunk of the chunked KL (bounds logit memory)")
    kl_vocab_chunk: int | None = req("vocabulary columns per KL chunk (null: the whole vocabulary)", minimum=1)


@dataclass(kw_only=True)
class SrArmSpec:
    """One arm of BLD on Spaced Retrieval (`hybridlab.train.arms.sr_arm_specs`)."""

    name: str = req("the arm's name (baseline, freeze0-<s>, window<s>+<w>, longgap<f>, ...)")
    windows: list[list[float]] = opt([], "[[start, end], ...]: fractions of training with the recurrent "
                                             "blocks frozen")
    update_windows: list[list[NonNegInt]] = opt([], "the same windows in updates")
    scope: Literal["block", "mixer"] = opt("block", "what a freeze freezes")
    optimizer_after_unfreeze: Optimizer | None = opt(None, "optimiser after the release (null: keep AdamW)")
    long_gap_fraction: UnitFloat | None = opt(None, "share of long-gap examples in the train mix (null: as drawn)")


@dataclass(kw_only=True)
class BldSrJob:
    """One arm of BLD on Spaced Retrieval (train_bld_sr.py)."""

    arm: SrArmSpec = req("the arm")
    seed: NonNegInt = req(_SEED + ", long-gap resampling")
    train: BldSrTrain = req("model shape and run settings (train.bld_sr)")
    mixer: Mixer = req("the recurrent mixer")
    pattern: list[Literal["mixer", "full_attention"]] = req("layer types, one per layer", minItems=2)
    score_fractions: list[UnitFloat] = req("fractions of training at which score checkpoints are saved",
                                           minItems=1)
    score_updates: list[NonNegInt] = opt([], "updates at which score checkpoints are saved as well")


@dataclass(kw_only=True)
class NlArmSpec:
    """One arm of BLD on natural language (`hybridlab.train.arms.NLArm`)."""

    name: str = req("<mixer>-<baseline|bld>, or <mixer>-<size>-<baseline|bld> with several sizes")
    mixer: Mixer = req("the recurrent mixer")
    size: str = req("the size's name in train.bld_nl.sizes")
    variant: Literal["baseline", "bld"] = req("baseline, or BLD (recurrent layers frozen first)")


@dataclass(kw_only=True)
class BldNlJob:
    """One arm of BLD on natural language (train_bld_nl.py)."""

    arm: NlArmSpec = req("the arm")
    seed: NonNegInt = req(_SEED)
    shape: BldNlSize = req("the arm's model shape (train.bld_nl.sizes.<size>)")
    run: BldNlRun = req("run settings (train.bld_nl without sizes)")
    experiment: BldNlArms = req("pattern, freeze fraction and scope, optimiser (experiments.bld_nl without seeds)")
    document_mask: bool = opt(False, _DOCUMENT_MASK)


@dataclass(kw_only=True)
class MixtureStream(BldNlStream):
    """Hub presets, BLD-NL's English mixture: the streamed web source."""

    path: str | None = req("a local copy in the hub's layout (local_sources.<source>; null: the hub or HF cache)")


@dataclass(kw_only=True)
class BldNlBudget:
    """What the largest BLD-NL arm's token budget is counted from."""

    sizes: dict[str, BldNlSize] = req("train.bld_nl.sizes")
    run: BldNlRun = req("train.bld_nl without sizes")
    experiment: BldNlExperiment = req("experiments.bld_nl")


@dataclass(kw_only=True)
class MixtureJob:
    """One packed training mixture (pack_mixture.py): the multilingual one of a tokenizer, or BLD-NL's
    English one."""

    english: Lang = req("the English code (always in the mixture)")
    languages: list[Lang] = req("the other languages (empty: English only)")
    english_share: UnitFloat = req("share of English tokens")
    seq_len: PosInt = req("tokens per packed row")
    total_tokens: PosInt = req("train tokens to pack")
    val_fraction: UnitFloat = req("share of documents held out (unless heldout)")
    seed: NonNegInt = req("document order")
    block_rows: PosInt = opt(1, "consecutive rows kept together when shuffling (a BLD-NL sequence's rows)")
    heldout: Heldout = opt(UNSET, "held-out rows from the parallel corpus instead (absent: from the mixture)")
    stream: MixtureStream = opt(UNSET, "stream a web source instead of the corpus (hub presets, English)")
    bld_nl: BldNlBudget = opt(UNSET, "with stream: the budget the streamed tokens are sized by")


# script name -> the section its --params hold (the rules' key lists and the test of them read this)
JOBS: dict[str, type] = {
    "pretrain_teacher.py": TeacherJob,
    "convert_gguf_teacher.py": TeacherJob,
    "fetch_teacher.py": TeacherJob,
    "pack_mixture.py": MixtureJob,
    "train_bld_sr.py": BldSrJob,
    "train_bld_nl.py": BldNlJob,
}
DISTILL_JOBS: dict[int, type] = {1: DistillStage1Job, 2: DistillStage2Job}
