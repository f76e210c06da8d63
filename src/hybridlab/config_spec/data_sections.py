"""The data and model sections of a preset: local copies of the sources, the corpora and packed mixture
(`data`), and the teacher(s) (`models`)."""

from dataclasses import dataclass
from typing import Annotated, Literal

from hybridlab.config_spec.fields import (
    UNSET, Fraction, Langs, Name, NonNegFloat, PosInt, Schema, opt, req)


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
