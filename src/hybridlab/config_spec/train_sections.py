"""The training sections of a preset (`train`): teacher pre-training, two-stage distillation and the BLD
runs, each with its model shape and run settings."""

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from hybridlab.config_spec.fields import (
    UNSET, Label, NonNegFloat, NonNegInt, Optimizer, PosFloat, PosInt, Precision, Schedule, Schema, UnitFloat, opt,
    req)


Regex = Annotated[str, Schema(format="regex"), Label("regular expression")]
OpenUnitFloat = Annotated[float, Schema(minimum=0, exclusiveMaximum=1), Label("number in [0, 1)")]


@dataclass(kw_only=True)
class TrainRun:
    """The shared training loop's settings (`hybridlab.train.config.TrainConfig` is this section with its
    methods): every trainer (pre-training, distillation, BLD) builds one from its config section."""

    out_dir: Annotated[str, Schema(minLength=1)] = req("the run's work directory (checkpoints, metrics)")
    steps: PosInt | None = opt(None, "optimiser updates (or token_budget; exactly one)")
    token_budget: PosInt | None = opt(None, "training tokens (or steps; exactly one): steps = ceil(token_budget "
                                      "/ tokens per update)")
    seq_len: PosInt | None = opt(None, "tokens per sequence (required with token_budget)")
    micro_batch_size: PosInt = opt(8, "sequences per micro-batch")
    grad_accum: PosInt = opt(1, "micro-batches per update (global batch = micro_batch_size x grad_accum, "
                             "whatever the process count)")
    lr: PosFloat = opt(3e-4, "peak learning rate")
    min_lr_ratio: UnitFloat = opt(0.1, "final learning rate as a fraction of lr")
    warmup_steps: NonNegInt = opt(0, "linear warmup updates (at most steps)")
    schedule: Schedule = opt("cosine", "learning-rate schedule after the warmup")
    weight_decay: NonNegFloat = opt(0.1, "AdamW weight decay")
    betas: list[OpenUnitFloat] = opt([0.9, 0.95], "AdamW betas", minItems=2, maxItems=2)
    eps: PosFloat = opt(1e-8, "AdamW epsilon")
    grad_clip: PosFloat | None = opt(1.0, "gradient-norm clip (null: none)")
    optimizer: Optimizer = opt("adamw", "optimiser")
    optimizer_switch_step: NonNegInt | None = opt(None, "from this update on, optimizer_after_switch (BLD; set "
                                                  "both or neither)")
    optimizer_after_switch: Optimizer | None = opt(None, "the optimiser from optimizer_switch_step on")
    muon_lr: PosFloat | None = opt(None, "Muon's learning rate (null: lr, what match_rms_adamw scaling is for)")
    muon_momentum: OpenUnitFloat = opt(0.95, "Muon momentum")
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = opt("match_rms_adamw", "Muon's learning-rate scaling")
    lr_multipliers: dict[str, PosFloat] = opt({}, "parameter-name regex (re.search) -> lr multiplier; a "
                                              "parameter matches at most one", propertyNames={"format": "regex"})
    no_decay_patterns: list[Regex] = opt(["norm", r"(^|\.)bias$", "A_log", "dt_bias"], "parameter names without "
                                         "weight decay (beyond every parameter with ndim < 2)")
    muon_exclude_patterns: list[Regex] = opt(["embed", "lm_head", "wte", "wpe"], "2-D parameters that stay in "
                                             "AdamW when Muon is used (as do nn.Embedding weights)")
    seed: NonNegInt = opt(0, "seed of the data order and initialisation")
    log_every: PosInt = opt(10, "updates between metric rows")
    eval_every: PosInt | None = opt(None, "updates between held-out evaluations (null: none)")
    ckpt_every: PosInt | None = opt(None, "updates between checkpoints (null: the end only)")
    keep_last_k: PosInt = opt(2, "checkpoints the run keeps (the newest)")
    final_checkpoint: Literal["full", "weights"] = opt(
        "full", "the checkpoint after the last update: full (weights + optimiser state) or weights (the model "
        "only: nothing is left to resume but publishing)")
    precision: Precision = opt("auto", "auto: bf16 on CUDA, fp32 on CPU; fast: bf16 where its matmuls are "
                               "faster, else fp32")
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "where the run trains")
    progress: bool = opt(True, "a progress bar on the terminal")
    activation_checkpointing: bool = opt(False, "recompute each decoder layer in backward (memory for compute; "
                                         "the trajectory is unchanged)")
    fsdp: Literal["auto", "always"] = opt("auto", "FSDP2 sharding: auto (under torchrun with several processes) "
                                          "or always (in one process too: the multi-GPU code path)")


@dataclass(kw_only=True)
class Run:
    """Teacher pre-training (pretrain_teacher.py): a TrainConfig run."""

    steps: PosInt = req("optimiser updates")
    micro_batch_size: PosInt = req("sequences per micro-batch")
    grad_accum: PosInt = opt(1, "micro-batches per update (global batch = micro_batch_size x grad_accum)")
    lr: PosFloat = req("peak learning rate")
    warmup_steps: NonNegInt = opt(0, "linear warmup updates")
    schedule: Schedule = opt("cosine", "learning-rate schedule after the warmup")
    weight_decay: NonNegFloat = opt(0.1, "AdamW weight decay")
    optimizer: Optimizer = opt("adamw", "optimiser")
    eval_every: PosInt = opt(UNSET, "updates between held-out evaluations (absent: none)")
    ckpt_every: PosInt = opt(UNSET, "updates between checkpoints (absent: the end only)")
    eval_rows_per_language: PosInt = opt(8, "held-out rows per language")
    epochs: PosInt = opt(UNSET, "passes over the mixture the run may make (without it: at most one, checked "
                         "before training)")


@dataclass(kw_only=True)
class DistillStage:
    """One distillation stage: `steps` or `token_budget` (exactly one), then TrainConfig settings."""

    __schema_extra__: ClassVar[dict] = {"oneOf": [{"required": ["steps"]}, {"required": ["token_budget"]}]}

    steps: PosInt = opt(UNSET, "optimiser updates (or token_budget; exactly one)")
    token_budget: PosInt = opt(UNSET, "training tokens (or steps; exactly one)")
    epochs: PosInt = opt(UNSET, "passes over the mixture the stage may make (without it: at most one, checked "
                         "before training)")
    micro_batch_size: PosInt = req("sequences per micro-batch")
    grad_accum: PosInt = opt(1, "micro-batches per update (global batch = micro_batch_size x grad_accum)")
    lr: PosFloat = req("peak learning rate")
    min_lr_ratio: UnitFloat = opt(0.1, "final learning rate as a fraction of lr")
    warmup_steps: NonNegInt = opt(0, "linear warmup updates")
    schedule: Schedule = opt("cosine", "learning-rate schedule after the warmup")
    weight_decay: NonNegFloat = opt(0.1, "AdamW weight decay")
    grad_clip: float | None = opt(1.0, "gradient-norm clip (null: none)", exclusiveMinimum=0)
    optimizer: Optimizer = opt("adamw", "optimiser")
    log_every: PosInt = opt(10, "updates between metric rows")
    precision: Precision = opt("auto", "auto: bf16 on CUDA, fp32 on CPU; fast: bf16 where its matmuls are faster (CUDA, CPUs with AMX), else fp32")
    fsdp: Literal["auto", "always"] = opt("auto", "FSDP2 sharding: auto (under torchrun with several processes) or "
                                                  "always (in one process too: the multi-GPU code path on one device)")


@dataclass(kw_only=True)
class DistillShared:
    """The distillation settings both stages read."""

    eval_every_tokens: PosInt = req("training tokens between held-out CE/KL points (rounded to updates)")
    ckpt_every_tokens: PosInt = req("training tokens between checkpoints")
    keep_last_k: PosInt = opt(2, "checkpoints each run keeps in its work directory (the newest; a paper-size "
                              "stage-2 checkpoint is ~57 GB)")
    final_checkpoint: Literal["full", "weights"] = opt(
        "full", "the checkpoint written after the last update: full (weights + optimiser state) or weights (the "
        "model only: a rerun then only publishes; a third of a stage-2 checkpoint)")
    eval_rows_per_language: PosInt = req("held-out rows per language for the curves")
    eval_batch_size: PosInt = req("rows per evaluation batch")
    gradient_checkpointing: bool = req("recompute each decoder layer in backward")
    teacher_sharding: Literal["replicate", "shard"] = opt(
        "replicate", "the frozen teacher on every rank (replicate) or FSDP-sharded over the ranks (shard)")


@dataclass(kw_only=True)
class DistillStage1Settings:
    """Distillation stage 1's own settings."""

    stage1: DistillStage = req("stage 1: the new mixers align to the attention they replace")
    stage1_inputs: Literal["teacher", "student"] = req(
        "stage 1 inputs of mixer i: the teacher's attention input (RADLADS) or the student's own")


@dataclass(kw_only=True)
class DistillStage2Settings:
    """Distillation stage 2's own settings."""

    stage2: DistillStage = req("stage 2: logit distillation (KL) of the whole student")
    kl_chunk_tokens: PosInt = req("rows per chunk of the chunked KL (bounds logit memory)")
    kl_vocab_chunk: int | None = req("vocabulary columns per KL chunk (null: the whole vocabulary)", minimum=1)


@dataclass(kw_only=True)
class DistillTrain(DistillShared, DistillStage2Settings, DistillStage1Settings):
    """Two-stage distillation (workflow_scripts/distill.py): one run per stage, held-out curves every
    eval_every_tokens."""

    table_rows_per_language: int | None = req("held-out rows per language for the perplexity table "
                                              "(null: all)", minimum=1)
    eval_dtype: Literal["float32", "bfloat16", "fast"] = opt(
        UNSET, "dtype of the models in the perplexity table (absent: bfloat16 on CUDA, float32 on CPU; fast: "
        "bfloat16 where its matmuls are faster, CUDA or a CPU with AMX)")


@dataclass(kw_only=True)
class BldSrModel:
    """The BLD-SR hybrid's shape (its depth is experiments.bld_sr.pattern's length)."""

    hidden_size: PosInt = req("model width")
    num_attention_heads: PosInt = req("query heads")
    num_key_value_heads: PosInt = req("key/value heads")
    head_dim: PosInt = req("width of one head")
    intermediate_size: PosInt = req("MLP width")
    mixer_chunk_size: PosInt = opt(UNSET, "chunk size of the mixers' chunked kernels (absent: fla's default)")


@dataclass(kw_only=True)
class BldSrTrain:
    """BLD on Spaced Retrieval: model shape and run settings of every arm (train_bld_sr.py)."""

    model: BldSrModel = req("the hybrid's shape")
    steps: PosInt = req("optimiser updates per arm")
    micro_batch_size: PosInt = req("sequences per micro-batch")
    grad_accum: PosInt = opt(1, "micro-batches per update")
    lr: PosFloat = req("peak learning rate")
    min_lr_ratio: UnitFloat = opt(0.1, "final learning rate as a fraction of lr")
    warmup_steps: NonNegInt = opt(0, "linear warmup updates")
    schedule: Schedule = opt("cosine", "learning-rate schedule after the warmup")
    weight_decay: NonNegFloat = opt(0.1, "AdamW weight decay")
    grad_clip: float | None = opt(1.0, "gradient-norm clip (null: none)", exclusiveMinimum=0)
    optimizer: Optimizer = opt("adamw", "optimiser before any unfreeze switch")
    log_every: PosInt = opt(10, "updates between metric rows")
    eval_every: PosInt = req("updates between evaluations")
    ckpt_every: PosInt = opt(UNSET, "updates between checkpoints (absent: the end only)")
    keep_last_k: PosInt = opt(2, "checkpoints each run keeps in its work directory (the newest; a paper-size "
                              "stage-2 checkpoint is ~57 GB)")
    final_checkpoint: Literal["full", "weights"] = opt(
        "full", "the checkpoint written after the last update: full (weights + optimiser state) or weights (the "
        "model only: a rerun then only publishes; a third of a stage-2 checkpoint)")
    eval_rows_per_gap: PosInt = req("evaluation examples per gap")
    precision: Precision = opt("auto", "auto: bf16 on CUDA, fp32 on CPU; fast: bf16 where its matmuls are faster (CUDA, CPUs with AMX), else fp32")


@dataclass(kw_only=True)
class BldNlSize:
    """One BLD-NL model size (arms are <mixer>-<size>-<baseline|bld>)."""

    hidden_size: PosInt = req("model width")
    num_hidden_layers: PosInt = req("decoder layers")
    num_attention_heads: PosInt = req("query heads")
    num_key_value_heads: PosInt = req("key/value heads")
    head_dim: PosInt = req("width of one head")
    intermediate_size: PosInt = req("MLP width")
    mixer_chunk_size: PosInt = opt(UNSET, "chunk size of the mixers' chunked kernels (absent: fla's default)")


@dataclass(kw_only=True)
class BldNlRun:
    """The run settings every BLD natural-language arm shares (train_bld_nl.py); exactly one of steps /
    tokens_per_param (checked when the DAG is built)."""

    context_len: Annotated[int, Schema(minimum=8)] = req("tokens per training sequence (a multiple of "
                                                         "data.seq_len)")
    tokenizer: str = opt(UNSET, "short name in data.tokenizers (optional with one tokenizer)")
    epochs: PosInt = opt(UNSET, "passes over the English mixture an arm may make (without it: at most one, "
                         "checked before training)")
    steps: PosInt = opt(UNSET, "optimiser updates per arm (or tokens_per_param)")
    tokens_per_param: PosFloat = opt(UNSET, "training tokens per model parameter (or steps)")
    micro_batch_size: PosInt = req("sequences per micro-batch")
    grad_accum: PosInt = opt(1, "micro-batches per update")
    lr: PosFloat = req("peak learning rate")
    warmup_fraction: Annotated[float, Schema(minimum=0, exclusiveMaximum=1)] = opt(
        0.0, "linear warmup as a fraction of the updates")
    weight_decay: NonNegFloat = opt(0.1, "AdamW weight decay")
    eval_every: PosInt = req("updates between evaluations")
    ckpt_every: PosInt = opt(UNSET, "updates between checkpoints (absent: the end only)")
    keep_last_k: PosInt = opt(2, "checkpoints each run keeps in its work directory (the newest; a paper-size "
                              "stage-2 checkpoint is ~57 GB)")
    final_checkpoint: Literal["full", "weights"] = opt(
        "full", "the checkpoint written after the last update: full (weights + optimiser state) or weights (the "
        "model only: a rerun then only publishes; a third of a stage-2 checkpoint)")
    eval_rows: PosInt = opt(16, "held-out rows per evaluation")
    gradient_checkpointing: bool = opt(False, "recompute each decoder layer in backward (the memory plan counts "
                                       "what this says)")


@dataclass(kw_only=True)
class BldNlTrain(BldNlRun):
    """BLD on natural language: model sizes and run settings of every arm (train_bld_nl.py); exactly one of
    steps / tokens_per_param (checked when the DAG is built)."""

    sizes: dict[str, BldNlSize] = req("size name -> model shape", minProperties=1,
                                      propertyNames={"pattern": "^[A-Za-z0-9.]+$"})


@dataclass(kw_only=True)
class Train:
    """Training runs of one preset."""

    teacher: Run = opt(UNSET, "offline presets: teacher pre-training")
    distill: DistillTrain = opt(UNSET, "two-stage distillation of every student")
    bld_sr: BldSrTrain = opt(UNSET, "BLD on Spaced Retrieval")
    bld_nl: BldNlTrain = opt(UNSET, "BLD on natural language")
