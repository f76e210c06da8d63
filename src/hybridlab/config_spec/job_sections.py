"""The settings each pipeline job takes: one typed section per job, the JSON object its rule passes as
``--params``.

A rule builds its params from these fields (`job_keys`), the job builds and validates its section from
them (`hybridlab.config_spec.job_settings`: an unknown or missing key, or a value of the wrong type, is one
line), and the script's ``--help`` prints the section (`describe_job`). Most fields are config sections
passed through whole (a distillation stage, a BLD run); the rest are what the rule adds for one job (the
replicate seed, the arm).
"""

from dataclasses import dataclass
from typing import Literal

from hybridlab.config_spec.data_sections import BldNlStream, Heldout, SpacedRetrieval, TeacherShape
from hybridlab.config_spec.eval_sections import (
    Fertility, HubPair, LayerImportance, LmEval, Niah, PositionLoss, Recency, RetrievalHeads, RetrievalScore, SoftCka)
from hybridlab.config_spec.fields import (
    UNSET, Dtype, Fraction, Lang, Langs, Mixer, Name, NonNegFloat, NonNegInt, Optimizer, Placement, PosInt, Scale,
    UnitFloat, opt, req)
from hybridlab.config_spec.train_sections import (
    BldNlRun, BldNlSize, BldSrTrain, DistillShared, DistillStage1Settings, DistillStage2Settings, Run)
from hybridlab.config_spec.tree import BldNlArms, BldNlExperiment

_SEED = "the replicate seed: initial weights, data order"
_DOCUMENT_MASK = "document-masked training and evaluation (data.packing.document_mask)"


@dataclass(kw_only=True)
class HubCorpusJob:
    """The corpus of a hub preset (build_hub_corpus.py): FLoRes+ or FLORES-200, and FineWeb-2 + an English web
    source or NTREX-128, each from the hub or a local copy."""

    english: Lang = req("the English code (first among the parallel languages)")
    parallel_languages: Langs = req("data.parallel_languages")
    mono_languages: Langs = req("data.mono_languages")
    flores_split: Literal["dev", "devtest"] = opt("devtest", "the FLoRes split read")
    fineweb2_docs_per_language: PosInt = opt(UNSET, "FineWeb-2 documents per language (not with ntrex128)")
    english_web: Literal["fineweb", "dclm"] = opt("fineweb", "the English web source")
    english_web_docs: PosInt = opt(UNSET, "English web documents (not with ntrex128)")
    ntrex_sentences_per_doc: PosInt = opt(16, "with ntrex128: sentences joined into a document")
    local_sources: dict[str, str | None] = opt(
        {}, "dataset (flores_plus, flores200, fineweb2, fineweb, dclm, ntrex128, pg19) -> a local copy in the hub's "
        "layout, or null for the hub (`hybridlab.data.local_sources`)")


@dataclass(kw_only=True)
class HubLayoutJob:
    """Local copies in each hub's layout from a corpus (make_hub_layout.py, a tool outside the DAG)."""

    split: Literal["dev", "devtest"] = opt("devtest", "the FLoRes split written")
    shards: PosInt = opt(2, "files per dataset config")


@dataclass(kw_only=True)
class GatherJob:
    """The gather of one evaluation's per-model tables (gather_eval.py)."""

    models: list[Name] = req("the model names, in the order of --inputs (recorded with the outputs)")
    pairs: list[Name] = opt(UNSET, "softcka: the pairs whose rows the table keeps (absent: every pair)")


@dataclass(kw_only=True)
class FigureJob:
    """One figure or table (make_figure.py)."""

    preset: Scale = opt(UNSET, "the preset (makes the output depend on the configuration)")
    config_hash: str = opt(UNSET, "the configuration's hash (the same)")
    baseline_placement: Placement = opt(UNSET, "tables comparing placements: the one the others are compared with")
    converged_kl: NonNegFloat = opt(UNSET, "the findings table: the held-out KL to the teacher within which a row "
                                    "about distilled students is decided (experiments.distill.converged_kl)")


@dataclass(kw_only=True)
class TokenizerJob:
    """One tokenizer (train_tokenizer.py): a byte-level BPE trained on the corpus, or a hub tokenizer saved."""

    vocab_size: PosInt | None = req("the BPE's vocabulary (data.tokenizer_vocab_size; null with hub_tokenizer)")
    hub_tokenizer: str | None = req("a hub id or model directory whose tokenizer is saved (null: train the BPE)")
    seed: NonNegInt = req("the preset's seed (part of the job's settings)")


@dataclass(kw_only=True)
class SpacedRetrievalJob(SpacedRetrieval):
    """The Spaced Retrieval splits (make_spaced_retrieval.py): data.spaced_retrieval and the seed."""

    seed: NonNegInt = req("draws the examples")


@dataclass(kw_only=True)
class ConvertJob:
    """One converted student (convert_student.py)."""

    placement: Placement | Literal["all_mixers"] = req(
        "where the full-attention layers sit (a searched one reads --importance; all_mixers: none, the importance "
        "pass's student)")
    mixer: Mixer = req("the recurrent mixer of the other layers")
    fa_ratio: Fraction = req("share of the teacher's layers kept as full attention")
    seed: NonNegInt = req("the replicate seed: draws the new mixers' parameters")
    conv_init: Literal["random", "identity"] = opt(
        "identity", "q/k/v short convolutions: identity (last tap 1) or fla's random init")


@dataclass(kw_only=True)
class ResultsPageJob:
    """The generated results page (make_results_page.py)."""

    preset: Scale = req("the preset the page reports")
    header: str = opt("", "text above the tables")
    converged_kl: NonNegFloat = opt(UNSET, "the findings' convergence limit (experiments.distill.converged_kl), "
                                    "stated on the page")


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
class _DistillJob(DistillShared):
    """What both distillation stages read: train.distill's shared settings, the seed, the document mask."""

    seed: NonNegInt = req(_SEED + " (the same for every placement of that seed)")
    document_mask: bool = opt(False, _DOCUMENT_MASK)


@dataclass(kw_only=True)
class DistillStage1Job(_DistillJob, DistillStage1Settings):
    """Distillation stage 1 (distill.py --stage 1): the new mixers align to the attention they replace."""


@dataclass(kw_only=True)
class DistillStage2Job(_DistillJob, DistillStage2Settings):
    """Distillation stage 2 (distill.py --stage 2): forward KL of the logits, the whole student trains."""


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


@dataclass(kw_only=True)
class DistilledPair:
    """A distilled student and its teacher, analysed as a pair (`hybridlab.eval.pairs.analysis_models`)."""

    teacher: Name = req("the teacher's name")
    teacher_path: Name = req("the teacher's model directory")
    student: Name = req("<placement>-<mixer>")
    student_path: Name = req("the stage-2 student's directory")
    tokenizer: Name = req("the tokenizer both read")


@dataclass(kw_only=True)
class AnalysisModels:
    """The models one analysis job reads: distilled pairs and published hub pairs."""

    distilled: list[DistilledPair] = opt([], "each distilled student with its teacher")
    hub_pairs: list[HubPair] = opt([], "published hybrid vs non-hybrid pairs")


@dataclass(kw_only=True)
class _AnalysisJob:
    """What every multilinguality analysis reads besides its own settings."""

    models: AnalysisModels = req("the analysed models (a per-model job: the pairs of its model)")
    dtype: Dtype = req("model dtype (eval.analysis.dtype)")
    seed: NonNegInt = req("sampling of sentences and bootstrap replicates")
    english: Lang = req("the English code (the reference language)")


@dataclass(kw_only=True)
class SoftckaJob(_AnalysisJob):
    """SoftCKA of one model or all (eval_softcka.py)."""

    softcka: SoftCka = req("eval.analysis.softcka")


@dataclass(kw_only=True)
class RecencyJob(_AnalysisJob):
    """Attention recency (eval_recency.py)."""

    recency: Recency = req("eval.analysis.recency")


@dataclass(kw_only=True)
class FertilityJob(_AnalysisJob):
    """Tokenizer fertility (eval_fertility.py)."""

    fertility: Fertility = req("eval.analysis.fertility")


@dataclass(kw_only=True)
class NiahJob(_AnalysisJob):
    """Multilingual needle-in-a-haystack of one model or all (eval_niah.py)."""

    niah: Niah = req("eval.analysis.niah")


@dataclass(kw_only=True)
class RetrievalScoreJob(RetrievalScore):
    """Layer Retrieval Ability Score of every BLD-SR arm (eval_retrieval_score.py): eval.retrieval_score and
    the seed of the A/B pairs."""

    seed: NonNegInt = req("draws the A/B pairs")


@dataclass(kw_only=True)
class _HeadsPositionJob:
    """What the BLD-NL analyses read besides their own settings."""

    seed: NonNegInt = req("example draws and bootstrap replicates")
    device: Literal["cpu", "cuda"] = opt("cpu", "where the models run")
    dtype: Literal["float32", "bfloat16"] = opt("float32", "model dtype")


@dataclass(kw_only=True)
class RetrievalHeadsJob(_HeadsPositionJob):
    """Retrieval heads of every BLD-NL arm (eval_retrieval_heads.py)."""

    retrieval_heads: RetrievalHeads = req("eval.heads_position.retrieval_heads")


@dataclass(kw_only=True)
class PositionLossJob(_HeadsPositionJob):
    """Per-position loss and LongPPL of every BLD-NL arm (eval_position_loss.py)."""

    position_loss: PositionLoss = req("eval.heads_position.position_loss")


@dataclass(kw_only=True)
class LmBenchmarksJob(_HeadsPositionJob):
    """lm-eval benchmarks of one model (eval_lm_benchmarks.py)."""

    lm_eval: LmEval = req("eval.heads_position.lm_eval")


@dataclass(kw_only=True)
class PerplexityStudent:
    """One stage-2 student of the perplexity table."""

    teacher: Name = req("its teacher's name (a key of teachers)")
    placement: Placement = req("where its full-attention layers sit")
    mixer: Mixer = req("its recurrent mixer")
    seed: NonNegInt | None = opt(None, "its replicate seed")
    dir: Name = req("its stage-2 directory (model and metrics.parquet)")


@dataclass(kw_only=True)
class PerplexityJob:
    """Held-out CE / KL of every teacher and stage-2 student, and tokens to the baseline (eval_perplexity.py)."""

    teachers: dict[str, Name] = req("teacher name -> model directory")
    students: list[PerplexityStudent] = req("every stage-2 student")
    rows_per_language: int | None = req("held-out rows per language (null: all)", minimum=1)
    batch_size: PosInt = req("rows per evaluation batch")
    baseline_placement: Placement = req("the placement the others are compared with")
    mixtures: dict[str, Name] = opt({}, "teacher name -> its mixture directory (absent: --mixture)")
    dtype: Literal["float32", "bfloat16", "fast"] = opt(
        UNSET, "model dtype (absent: bfloat16 on CUDA, float32 on CPU; fast: bfloat16 where its matmuls are faster)")


@dataclass(kw_only=True)
class LayerImportanceJob(LayerImportance):
    """Layer importance of one teacher x mixer (eval_layer_importance.py)."""

    teacher: Name = req("the teacher's name (a column of the tables)")
    mixer: Mixer = req("the stage-1 student's mixer")
    english: Lang = req("the English code (always scored)")
    fa_ratio: Fraction = req("share of layers kept as full attention: the size of the chosen set")
    seed: NonNegInt = req("bootstrap seed")


# script name -> the section its --params hold (the rules' key lists and the test of them read this)
JOBS: dict[str, type] = {
    "build_hub_corpus.py": HubCorpusJob,
    "make_hub_layout.py": HubLayoutJob,
    "gather_eval.py": GatherJob,
    "make_figure.py": FigureJob,
    "train_tokenizer.py": TokenizerJob,
    "make_spaced_retrieval.py": SpacedRetrievalJob,
    "convert_student.py": ConvertJob,
    "make_results_page.py": ResultsPageJob,
    "pretrain_teacher.py": TeacherJob,
    "convert_gguf_teacher.py": TeacherJob,
    "fetch_teacher.py": TeacherJob,
    "pack_mixture.py": MixtureJob,
    "train_bld_sr.py": BldSrJob,
    "train_bld_nl.py": BldNlJob,
    "eval_softcka.py": SoftckaJob,
    "eval_recency.py": RecencyJob,
    "eval_fertility.py": FertilityJob,
    "eval_niah.py": NiahJob,
    "eval_perplexity.py": PerplexityJob,
    "eval_retrieval_score.py": RetrievalScoreJob,
    "eval_retrieval_heads.py": RetrievalHeadsJob,
    "eval_position_loss.py": PositionLossJob,
    "eval_lm_benchmarks.py": LmBenchmarksJob,
    "eval_layer_importance.py": LayerImportanceJob,
    "assemble_stage1.py": DistillStage2Job,  # evaluates on stage 2's curve rows, in its precision
}
DISTILL_JOBS: dict[int, type] = {1: DistillStage1Job, 2: DistillStage2Job}
