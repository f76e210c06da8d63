"""Glue of the multilingual analysis rules: which models form hybrid-vs-dense pairs, loading them, and
the text they read (parallel sentence samples, monolingual windows, NIAH haystacks).

Definitions (this project's):

- An *analysis model* is one model the SoftCKA / recency / NIAH rules run: a name for the tables, a
  local directory or hub id, the tokenizer to read text with, and the pairs it belongs to. Every
  model is loaded and analysed ONCE; its table rows are repeated for each pair it belongs to, so a
  table can be faceted by `pair` directly.
- *Distilled pairs* (every preset, from the DAG): pair `<teacher>/<placement>-<mixer>` = the distilled
  student (role `hybrid`) vs its teacher (role `dense`). The teacher therefore belongs to one pair
  per student. Teachers are called by their DAG name (`teacher` at smoke/tiny, the hub id at paper).
- *Hub pairs* (paper preset, `eval.analysis.hub_pairs`): published hybrid vs non-hybrid models named
  by `name`; `dense` may be omitted for a hybrid with no dense sibling (the sliding-window hybrids
  Tiny Aya Global and OLMo-3: their SWA layers are the "linear" side and their global layers FA).
- `layer_types(model)`: one label per decoder layer, `full_attention` or the mixer kind, from the
  hybridlab spec of a converted hybrid (`gdn`, `kda`, `gla`), else `config.layer_types` with
  transformers' synonyms mapped (`attention` -> `full_attention`; others such as `linear_attention`,
  `mamba`, `sliding_attention` kept), else `full_attention` for every layer whose token mixer is a
  `self_attn` module. FA layers are the `full_attention` ones (attention recency reads only these).
- Text: `parallel_sample` = a seeded sample of N sids present in English and every analysed language,
  in sid order, so sentence i of every language is a translation of the same source; `mono_documents`
  = each language's documents in a seeded order, `token_windows` = the first `length` tokens of the
  first documents that are at least that long; `haystack_sentences` = documents split at line breaks
  and sentence-final punctuation (. ! ? + space; the danda and CJK full stops without a space).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from hybridlab.errors import HybridlabError

FULL_ATTENTION = "full_attention"
ROLES = ("hybrid", "dense")
_SYNONYMS = {"attention": FULL_ATTENTION, "full": FULL_ATTENTION, "global": FULL_ATTENTION,
             "global_attention": FULL_ATTENTION}


@dataclass
class AnalysisModel:
    """One model to analyse; `pairs` maps each pair name it belongs to onto its role there."""

    name: str
    path: str  # local directory (save_pretrained or save_hybrid layout) or hub id
    tokenizer: str  # local tokenizer directory or hub id
    pairs: dict[str, str] = field(default_factory=dict)  # pair -> "hybrid" | "dense"
    trust_remote_code: bool = False
    hub: bool = False  # a published hub model (reads its own tokenizer) rather than a model of the DAG


def _add(models: dict[str, AnalysisModel], name: str, path: str, tokenizer: str, pair: str, role: str,
         trust_remote_code: bool, hub: bool) -> None:
    if role not in ROLES:
        raise HybridlabError(f"role {role!r} of model {name!r} is not one of {ROLES}")
    m = models.get(name)
    if m is None:
        models[name] = AnalysisModel(name, path, tokenizer, {pair: role}, trust_remote_code, hub)
        return
    if (m.path, m.tokenizer) != (path, tokenizer):
        raise HybridlabError(f"model name {name!r} is used for two different models ({m.path} and {path}); "
                             "give each analysis model a unique name")
    if m.pairs.get(pair, role) != role:
        raise HybridlabError(f"model {name!r} is both hybrid and dense in pair {pair!r}; fix the pair list")
    m.pairs[pair] = role
    m.trust_remote_code = m.trust_remote_code or trust_remote_code


def model_slug(name: str) -> str:
    """A model name as a file name and a wildcard value: hub ids and nested paths with '/' replaced by '--'."""
    return name.replace("/", "--")


def analysis_models(distilled: Sequence[dict[str, str]] = (), hub_pairs: Sequence[dict[str, Any]] = ()
                    ) -> list[AnalysisModel]:
    """The models to analyse, each once, in a stable order (first appearance).

    `distilled`: dicts with teacher, teacher_path, student (`<placement>-<mixer>`), student_path,
    tokenizer. `hub_pairs`: dicts with name, hybrid, optional dense, optional trust_remote_code
    (hub models read their own tokenizer).
    """
    models: dict[str, AnalysisModel] = {}
    for d in distilled:
        missing = {"teacher", "teacher_path", "student", "student_path", "tokenizer"} - set(d)
        if missing:
            raise HybridlabError(f"distilled pair {d} lacks {sorted(missing)}")
        pair = f"{d['teacher']}/{d['student']}"
        _add(models, pair, d["student_path"], d["tokenizer"], pair, "hybrid", False, False)
        _add(models, d["teacher"], d["teacher_path"], d["tokenizer"], pair, "dense", False, False)
    names = [p.get("name") for p in hub_pairs]
    if len(set(names)) != len(names):
        raise HybridlabError(f"hub pair names must be unique, got {names}")
    for p in hub_pairs:
        if not p.get("name") or not p.get("hybrid"):
            raise HybridlabError(f"hub pair {p} needs a name and a hybrid model")
        trust = bool(p.get("trust_remote_code", False))
        _add(models, p["hybrid"], p["hybrid"], p["hybrid"], p["name"], "hybrid", trust, True)
        if p.get("dense"):
            _add(models, p["dense"], p["dense"], p["dense"], p["name"], "dense", trust, True)
    if not models:
        raise HybridlabError("no analysis models: the preset has no distilled students and no eval.analysis."
                             "hub_pairs; enable include_distilled or list hub pairs")
    return list(models.values())


def pair_rows(model: AnalysisModel) -> list[dict[str, str]]:
    """One {model, pair, role} dict per pair of `model`: cross-join them with its per-model rows."""
    return [{"model": model.name, "pair": pair, "role": role} for pair, role in model.pairs.items()]


def load_analysis_model(model: AnalysisModel, *, dtype: str | None = None, device: str = "cpu",
                        eager_attention: bool = False):
    """(model in eval mode on `device`, tokenizer). `eager_attention` switches to attention that
    returns its probabilities (needed by attention recency)."""
    from hybridlab.models.registry import load_causal_lm, load_tokenizer_for

    if dtype == "fast":  # bf16 where its matmuls beat fp32 on the device the model runs on
        import torch

        from hybridlab.device import fast_dtype

        dtype = fast_dtype(dtype, torch.device(device).type)
    lm = load_causal_lm(model.path, dtype=dtype, trust_remote_code=model.trust_remote_code)
    if eager_attention:
        lm.set_attn_implementation("eager")
    tokenizer = load_tokenizer_for(model.tokenizer)
    return lm.to(device).eval(), tokenizer


def layer_types(model) -> list[str]:
    """`full_attention` or the mixer kind for every decoder layer (see the module docstring)."""
    from hybridlab.models.sites import find_mixer_sites

    spec = getattr(model, "hybridlab_spec", None)
    if spec is not None:
        return list(spec.layer_types)
    sites = find_mixer_sites(model)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    types = getattr(config, "layer_types", None)
    if types is not None:
        if len(types) != len(sites):
            raise HybridlabError(f"config.layer_types has {len(types)} entries for {len(sites)} decoder layers")
        return [_SYNONYMS.get(str(t), str(t)) for t in types]
    if all(s.mixer_name == "self_attn" for s in sites):
        return [FULL_ATTENTION] * len(sites)
    raise HybridlabError(f"{type(model).__name__} has no config.layer_types and non-attention mixers "
                         f"({sorted({s.mixer_name for s in sites})}); cannot tell which layers are full attention")


def fa_layers(model) -> list[int]:
    """Indices of the full-attention decoder layers."""
    return [i for i, t in enumerate(layer_types(model)) if t == FULL_ATTENTION]


def parallel_sample(parallel, english: str, languages: Sequence[str] | None, n_sentences: int, seed: int
                    ) -> dict[str, list[str]]:
    """{lang: texts} for English first, then `languages` (None = every other language in the corpus), over
    the same seeded sample of `n_sentences` sids present in all of them, in sid order."""
    import random

    import polars as pl

    have = sorted(set(parallel["lang"].unique().to_list()))
    if english not in have:
        raise HybridlabError(f"the parallel corpus has no {english} rows; the analyses compare against English")
    langs = sorted(set(have) - {english}) if languages is None else list(languages)
    missing = sorted(set(langs) - set(have))
    if missing:
        raise HybridlabError(f"languages {missing} are not in the parallel corpus (it has {have}); "
                             "drop them from eval.analysis or add them to data.parallel_languages")
    if not langs:
        raise HybridlabError("no language besides English to compare; add parallel languages")
    wanted = [english] + [lang for lang in langs if lang != english]
    rows = parallel.filter(pl.col("lang").is_in(wanted))
    common = sorted(set.intersection(*(set(rows.filter(pl.col("lang") == lang)["sid"].to_list())
                                       for lang in wanted)))
    if len(common) < n_sentences:
        raise HybridlabError(f"only {len(common)} sentences are parallel across {wanted}, but n_sentences="
                             f"{n_sentences}; lower n_sentences or analyse fewer languages")
    sids = sorted(random.Random(seed).sample(common, n_sentences))
    out = {}
    for lang in wanted:
        by_sid = dict(rows.filter(pl.col("lang") == lang).select("sid", "text").iter_rows())
        out[lang] = [by_sid[s] for s in sids]
    return out


def mono_documents(mono, languages: Sequence[str], seed: int) -> dict[str, list[str]]:
    """{lang: its monolingual documents in a seeded order} for each requested language."""
    import random

    import polars as pl

    have = set(mono["lang"].unique().to_list())
    missing = sorted(set(languages) - have)
    if missing:
        raise HybridlabError(f"languages {missing} have no monolingual documents (the corpus has "
                             f"{sorted(have)}); drop them from eval.analysis or add them to data.mono_languages")
    out = {}
    for lang in languages:
        texts = mono.filter(pl.col("lang") == lang).sort("doc_id")["text"].to_list()
        random.Random(f"{seed}-{lang}").shuffle(texts)
        out[lang] = texts
    return out


def token_windows(tokenizer, texts: Sequence[str], n_sequences: int, length: int, lang: str) -> list[list[int]]:
    """The first `length` tokens of the first `n_sequences` texts that have at least `length` tokens."""
    out = []
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        if len(ids) >= length:
            out.append(list(ids[:length]))
            if len(out) == n_sequences:
                return out
    raise HybridlabError(f"{lang}: only {len(out)} of {len(texts)} documents have >= {length} tokens, "
                         f"{n_sequences} needed; lower input_tokens or n_sequences")


# after . ! ? when whitespace follows; after the danda and CJK full stops always (no spaces in those scripts)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[\u0964\u3002\uff01\uff1f])\s*")


def haystack_sentences(texts: Sequence[str]) -> list[str]:
    """Documents split into sentences: at line breaks, then after sentence-final punctuation."""
    return [s.strip() for text in texts for line in text.splitlines() for s in _SENTENCE_END.split(line)
            if s.strip()]


def arm_columns(model_dir, name: str | None = None) -> dict:
    """{model, mixer, size, variant} of a BLD natural-language arm from its hybrid.json (save_hybrid layout,
    written by the bld_nl rule): `model` is `name` (default the directory's name), `mixer` the spec's
    mixer kind, `size` and `variant` the spec's `extra` entries (None when absent)."""
    from pathlib import Path

    from hybridlab.models.io import read_spec

    spec = read_spec(model_dir)
    extra = spec.get("extra") or {}
    return {"model": name if name is not None else Path(model_dir).name, "mixer": spec["mixer_kind"],
            "size": extra.get("size"), "variant": extra.get("variant")}
