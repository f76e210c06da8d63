"""Byte-level BPE tokenizer for the smoke/tiny presets, and one loader for local and hub tokenizers.

Definitions:

* Model: byte-level BPE (GPT-2 style) trained with `tokenizers`. The ByteLevel pre-tokenizer maps every
  UTF-8 byte to a printable symbol and the initial alphabet holds all 256 byte symbols, so any string
  (Devanagari, Thai, CJK, Arabic, emoji, ...) encodes without unknown tokens and
  ``decode(encode(x)) == x`` exactly. There is no normaliser (NFC/NFKC would break the round trip).
* One special token, ``<|endoftext|>``, with id 0; it is BOS, EOS and PAD. No post-processor: callers
  (packing) place EOS themselves, so ``encode`` adds nothing.
* Determinism: BPE training has no randomness; the same texts in the same order give a byte-identical
  ``tokenizer.json`` (tested). There is therefore no seed argument.
* Saved layout: ``<out_dir>/tokenizer.json`` + ``tokenizer_config.json`` (written by
  `transformers`), so both `load_tokenizer` and ``AutoTokenizer.from_pretrained(out_dir)`` load it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from typing import TYPE_CHECKING

from hybridlab.errors import HybridlabError

if TYPE_CHECKING:  # tokenizers / transformers load lazily: the Snakefile reads tokenizer_plan at every parse
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

EOT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


def _fast(tok: Tokenizer) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT)


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int,
    out_path: str | Path,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts`, save it under directory `out_path`, return the fast tokenizer.

    `vocab_size` counts the special token and the 256 byte symbols, so it must be > 257.
    """
    if vocab_size <= 257:
        raise HybridlabError(
            f"tokenizer: vocab_size={vocab_size} leaves no room for merges (257 ids are the byte alphabet + "
            f"{EOT}); set vocab_size > 257"
        )
    if min_frequency < 1:
        raise HybridlabError(f"tokenizer: min_frequency={min_frequency} must be >= 1")
    out_dir = Path(out_path)
    if out_dir.suffix == ".json":
        raise HybridlabError(f"tokenizer: out_path {out_dir} must be a directory (tokenizer.json is written inside it)")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    n_texts = 0

    def counted() -> Iterable[str]:
        nonlocal n_texts
        for text in texts:
            n_texts += 1
            yield text

    tok.train_from_iterator(counted(), trainer=trainer)
    if n_texts == 0:
        raise HybridlabError("tokenizer: no training texts were given; check that the corpus step produced text")

    out_dir.mkdir(parents=True, exist_ok=True)
    fast = _fast(tok)
    fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(path_or_hub_name: str | Path) -> PreTrainedTokenizerFast:
    """Local directory (with tokenizer.json) or tokenizer.json file -> fast tokenizer; else a hub model name."""
    from hybridlab.data.local_sources import resolve_model_source

    path = Path(resolve_model_source(path_or_hub_name))  # config local_sources.models: hub id -> local dir
    if path.is_dir():
        file = path / TOKENIZER_FILE
        if not file.is_file():
            raise HybridlabError(f"tokenizer: directory {path} has no {TOKENIZER_FILE}; point at a trained tokenizer dir")
        return _load_file(file)
    if path.is_file():
        if path.name.endswith(".json"):
            return _load_file(path)
        raise HybridlabError(f"tokenizer: {path} is a file but not a tokenizer.json; pass its directory or the json file")
    from transformers import AutoTokenizer

    name = str(path_or_hub_name)
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:  # transformers reports missing repos/files/network as OSError
        raise HybridlabError(
            f"tokenizer: {name!r} is no local path and loading it from the Hugging Face hub failed "
            f"({type(err).__name__}); check the model name, network/HF_HUB_OFFLINE, and HF_TOKEN for gated models"
        ) from err


def _load_file(file: Path) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception on malformed json
        raise HybridlabError(f"tokenizer: {file} is not a valid tokenizer.json ({err}); retrain or re-download it") from err
    if tok.token_to_id(EOT) is None:
        raise HybridlabError(f"tokenizer: {file} has no {EOT} token; train it with hybridlab.data.tokenizer.train_bpe")
    return _fast(tok)


# ---------------------------------------------------------------------------------------------------------
# One tokenizer per model: which tokenizer each DAG model reads, and which mixtures exist.

BPE_NAME = "bpe"  # the one tokenizer of an offline preset (trained in the DAG)


def teacher_key(name: str) -> str:
    """The teacher's name in paths and wildcards (`Qwen/Qwen3-4B` -> `Qwen--Qwen3-4B`)."""
    return name.replace("/", "--")


def teacher_name(key: str) -> str:
    """The hub name of a teacher key (`teacher_key`'s inverse: `Qwen--Qwen3-4B` -> `Qwen/Qwen3-4B`)."""
    return key.replace("--", "/")


def tokenizer_plan(cfg: dict) -> dict:
    """Tokenizers of a resolved preset and who uses them.

    Returns ``{"sources": {name: hub id | local dir | None}, "teachers": {teacher key: name},
    "bld_nl": name, "multilingual": [names], "english": [names]}``. ``None`` means the byte-level BPE
    trained in the DAG (offline presets, one tokenizer named ``bpe``). Hub presets name their
    tokenizers in ``data.tokenizers`` (short name -> hub id or local directory), map every teacher to
    one in ``models.teacher_tokenizers`` and BLD-NL in ``train.bld_nl.tokenizer`` (both optional when
    there is one tokenizer). A multilingual mixture is built per tokenizer a teacher uses, an English
    one for BLD-NL's.
    """
    data, models = cfg["data"], cfg["models"]
    scale = cfg.get("scale", "?")
    if data["source"] == "offline":
        if data.get("tokenizers"):
            raise HybridlabError(f"config: presets.{scale}.data.tokenizers is for hub presets; an offline preset "
                                 f"trains one BPE in the DAG (remove the key)")
        sources: dict[str, str | None] = {BPE_NAME: None}
        teachers = ["teacher"]
    else:
        sources = dict(data.get("tokenizers") or {})
        if not sources:
            raise HybridlabError(f"config: presets.{scale}.data.tokenizers is missing; name each model's tokenizer, "
                                 f"e.g. {{qwen3: Qwen/Qwen3-4B}}")
        teachers = [teacher_key(t) for t in models["teachers"]]
    only = next(iter(sources)) if len(sources) == 1 else None

    def pick(where: str, name: str | None) -> str:
        if name is None:
            if only is None:
                raise HybridlabError(f"config: {where} is missing; choose one of data.tokenizers {sorted(sources)}")
            return only
        if name not in sources:
            raise HybridlabError(f"config: {where} = {name!r} is not in data.tokenizers (allowed: "
                                 f"{', '.join(sorted(sources))})")
        return name

    mapping = {teacher_key(k): v for k, v in (models.get("teacher_tokenizers") or {}).items()}
    unknown = sorted(set(mapping) - set(teachers))
    if unknown:
        raise HybridlabError(f"config: presets.{scale}.models.teacher_tokenizers names {unknown}, which are not "
                             f"teachers (teachers: {sorted(teachers)})")
    by_teacher = {t: pick(f"presets.{scale}.models.teacher_tokenizers[{t.replace('--', '/')}]", mapping.get(t))
                  for t in teachers}
    bld = cfg.get("train", {}).get("bld_nl") or {}
    bld_tok = pick(f"presets.{scale}.train.bld_nl.tokenizer", bld.get("tokenizer"))
    return {"sources": sources, "teachers": by_teacher, "bld_nl": bld_tok,
            "multilingual": sorted(set(by_teacher.values())), "english": [bld_tok]}
