"""Inputs of the `rehearsal` preset: the paper preset's hub side, built locally at miniature size.

The rehearsal runs the paper preset's code paths on CPU (hub loaders, hub teachers with their own
tokenizers, published analysis pairs, torchrun + FSDP2, bf16, lm-eval). Everything the paper preset
downloads is replaced by a local copy in the hub's own layout, which `build_rehearsal_inputs(out)`
writes from the offline corpus:

- `hub/`: FLoRes+, FLORES-200, FineWeb-2, FineWeb and DCLM directories (`hybridlab.data.hub_layout`);
- `models/<name>/`: two random teachers of different architectures and tokenizers, a Qwen3-style one
  (byte-level BPE of `QWEN_VOCAB` tokens) and a Granite-style one with its embedding, residual,
  attention and logit multipliers (`GRANITE_VOCAB` tokens), each a `save_pretrained` directory with its
  tokenizer; and random models of every paired architecture transformers ships (Qwen3.5 text vs Qwen3,
  OLMo-Hybrid vs OLMo-3, GraniteMoeHybrid vs Granite) sharing the Qwen3-style tokenizer.

The preset's `local_sources.models` maps the hub ids it names (`REHEARSAL_IDS`) onto these
directories, so `fetch_teacher`, the analysis rules and lm-eval load them through the same
`resolve_model_source` path as real hub ids. Building is deterministic given the corpus and the seed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hybridlab.atomic import atomic_dir
from hybridlab.errors import HybridlabError

QWEN_VOCAB, GRANITE_VOCAB = 384, 448
# hub id (as the rehearsal preset names it) -> directory name under <out>/models
REHEARSAL_IDS = {
    "rehearsal/qwen3-teacher": "qwen3-teacher",
    "rehearsal/granite-teacher": "granite-teacher",
    "rehearsal/qwen3.5-text": "qwen3.5-text",
    "rehearsal/qwen3": "qwen3",
    "rehearsal/olmo-hybrid": "olmo-hybrid",
    "rehearsal/olmo-3": "olmo-3",
    "rehearsal/granitemoehybrid": "granitemoehybrid",
    "rehearsal/granite": "granite",
}
_DIMS = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=4096)


def _configs(vocab_q: int, vocab_g: int, eos_q: int, eos_g: int) -> dict:
    """Model configs by directory name (tiny shapes, the real architectures)."""
    from transformers import (GraniteConfig, GraniteMoeHybridConfig, Olmo3Config, OlmoHybridConfig, Qwen3Config,
                              Qwen3_5TextConfig)

    q = dict(vocab_size=vocab_q, bos_token_id=eos_q, eos_token_id=eos_q, pad_token_id=eos_q, **_DIMS)
    g = dict(vocab_size=vocab_g, bos_token_id=eos_g, eos_token_id=eos_g, pad_token_id=eos_g, **_DIMS)
    # the recurrent layers at the same miniature size (the library defaults are the 4B-7B models')
    linear = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    granite_mult = dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                        logits_scaling=8.0)
    return {
        "qwen3-teacher": Qwen3Config(num_hidden_layers=4, head_dim=16, tie_word_embeddings=True, **q),
        "granite-teacher": GraniteConfig(num_hidden_layers=4, tie_word_embeddings=True, **granite_mult, **g),
        "qwen3.5-text": Qwen3_5TextConfig(num_hidden_layers=4, head_dim=16, tie_word_embeddings=True,
                                          layer_types=["linear_attention"] * 3 + ["full_attention"], **linear, **q),
        "qwen3": Qwen3Config(num_hidden_layers=4, head_dim=16, tie_word_embeddings=True, **q),
        "olmo-hybrid": OlmoHybridConfig(num_hidden_layers=4, **linear, **q),
        "olmo-3": Olmo3Config(num_hidden_layers=4, **q),
        "granitemoehybrid": GraniteMoeHybridConfig(num_hidden_layers=4, num_local_experts=0,
                                                   layer_types=["mamba", "mamba", "mamba", "attention"],
                                                   mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=16,
                                                   **granite_mult, **q),
        "granite": GraniteConfig(num_hidden_layers=4, tie_word_embeddings=True, **granite_mult, **q),
    }


def _model_class(config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config)


# Prompt pieces in OneRULER's file format (keys and placeholders), worded by this project: the rehearsal
# runs the OneRULER code path without a copy of the benchmark.
REHEARSAL_ONERULER_PROMPTS = {
    "task": "Read the text below and remember it; a question about it follows.\n\n<text>\n{context}\n</text>\n\n",
    "needle_numbers": "The special magic number for \"{key}\" is: {value} ",
    "needle_words": "The special magic word for \"{key}\" is: {value} ",
    "question_single_numbers": "<Question> Which special magic numbers for \"{query1}\" does the text mention?",
    "question_multi_numbers": "<Question> Which special magic numbers for \"{query1}\" and \"{query2}\" does the text "
                              "mention?",
    "please_list": "List every one.",
    "if_no_numbers": "If there is none, answer \"none\".</Question>\n\n\n",
    "answer_prefix": "Answer in this format:\n",
    "answer_numbers": "<Answer> the numbers </Answer>",
    "none": "none",
}


def write_oneruler_layout(mono, out: Path, langs: tuple[str, ...] = ("eng_Latn",)) -> None:
    """A OneRULER-layout data directory (prompt/, vocab/, books/) for `langs`, from the offline corpus."""
    from hybridlab.eval.niah_examples import DEFAULT_WORDS
    from hybridlab.eval.oneruler import CODES, NOUNS

    codes = [CODES[lang] for lang in langs]
    (out / "vocab").mkdir(parents=True)
    rows = ["\t".join(codes)] + ["\t".join([w] * len(codes)) for w in DEFAULT_WORDS]
    (out / NOUNS).write_text("\n".join(rows) + "\n", encoding="utf-8")
    for lang, code in zip(langs, codes):
        (out / "prompt" / code).mkdir(parents=True)
        (out / "prompt" / code / "niah.txt").write_text(json.dumps(REHEARSAL_ONERULER_PROMPTS, indent=1))
        (out / "books" / code).mkdir(parents=True)
        text = " ".join(mono.filter(mono["lang"] == lang)["text"].to_list())
        (out / "books" / code / "rehearsal.txt").write_text(text, encoding="utf-8")


def build_rehearsal_inputs(corpus_dir: str | Path, out: str | Path, *, seed: int = 0) -> dict[str, str]:
    """Write `<out>/hub`, `<out>/models` and `<out>/oneruler` from a corpus directory (parallel.parquet, mono.parquet)."""
    import polars as pl

    from hybridlab.data.hub_layout import write_hub_layout
    from hybridlab.data.tokenizer import train_bpe

    corpus_dir, out = Path(corpus_dir), Path(out)
    files = [corpus_dir / "parallel.parquet", corpus_dir / "mono.parquet"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise HybridlabError(f"rehearsal inputs: {missing} not found; build the offline corpus first "
                             "(snakemake corpus --config scale=smoke) and pass its directory")
    parallel, mono = pl.read_parquet(files[0]), pl.read_parquet(files[1])
    with atomic_dir(out) as tmp:
        (tmp / "models").mkdir(parents=True)
        write_hub_layout(parallel, mono, tmp / "hub")

        texts = mono["text"].to_list() + parallel["text"].to_list()
        tok_q = train_bpe(texts, QWEN_VOCAB, 2, tmp / "tok-qwen3")
        tok_g = train_bpe(texts, GRANITE_VOCAB, 2, tmp / "tok-granite")
        configs = _configs(len(tok_q), len(tok_g), tok_q.eos_token_id, tok_g.eos_token_id)
        for i, (name, config) in enumerate(configs.items()):
            torch.manual_seed(seed + i)
            model = _model_class(config)
            d = tmp / "models" / name
            model.save_pretrained(d, safe_serialization=True)
            (tok_g if name == "granite-teacher" else tok_q).save_pretrained(d)
        for t in ("tok-qwen3", "tok-granite"):
            shutil.rmtree(tmp / t)
        write_oneruler_layout(mono, tmp / "oneruler")
        manifest = {hub_id: str(out / "models" / name) for hub_id, name in REHEARSAL_IDS.items()}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest
