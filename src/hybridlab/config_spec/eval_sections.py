"""The evaluation sections of a preset (`eval`): the multilinguality analyses (SoftCKA, recency, fertility,
NIAH), the retrieval score, and retrieval heads, position loss and lm-eval."""

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from hybridlab.config_spec.fields import (
    UNSET, Dtype, Langs, Name, NonNegFloat, NonNegInt, PosFloat, PosInt, Schema, opt, req)


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
    alignment: Literal["kme", "gram_rows"] = opt(
        "kme", "alignment statistic (kme: pair alignment, language offset and the pooled variant from one pooled "
        "Gram; gram_rows: cosine of centred Gram rows only)")
    n_boot: NonNegInt = opt(0, "bootstrap replicates over sentences for cka_lo/hi, alignment_lo/hi and "
                            "language_offset_lo/hi (0: no interval)")


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
class LayerImportance:
    """Layer importance per language (eval_layer_importance.py): the KL to the teacher when one layer is replaced
    by its stage-1 mixer; it chooses the searched placements' full-attention layers."""

    languages: Langs = req("parallel-corpus languages scored besides English")
    sentences: PosInt = req("sentences per language, taken from the end of the corpus (the held-out rows take "
                            "the start)")
    batch_size: PosInt = req("sentences per forward batch")
    n_boot: PosInt = opt(200, "bootstrap replicates over sentences (score intervals, top-set frequencies)")
    dtype: Dtype = opt("float32", "model dtype")


@dataclass(kw_only=True)
class Eval:
    """Evaluations of one preset."""

    analysis: Analysis = opt(UNSET, "SoftCKA / recency / fertility / NIAH")
    retrieval_score: RetrievalScore = opt(UNSET, "Layer Retrieval Ability Score")
    heads_position: HeadsPosition = opt(UNSET, "retrieval heads, position loss, lm-eval")
    layer_importance: LayerImportance = opt(UNSET, "layer importance per language (needed by searched placements)")
