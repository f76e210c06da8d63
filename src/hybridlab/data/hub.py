"""Hugging Face hub loaders for hub presets: FLoRes+ (or the FLORES-200 text release), FineWeb-2, FineWeb, DCLM,
and the NTREX-128 text shipped under ``data/``.

Every loader returns polars frames in the project's shared schemas (the offline builder writes the
same ones), with the PROJECT language code in ``lang`` whatever the dataset calls it:

* parallel: ``sid: Int64, lang: Utf8, text: Utf8, source: Utf8`` (long format, one row per sid x lang)
* mono:     ``doc_id: Utf8, lang: Utf8, text: Utf8, source: Utf8``

Config names come from the language registry (`languages.dataset_config`): FLoRes+ ``cmn_Hans`` for
``zho_Hans``, FineWeb-2 ``cmn_Hani`` / ``fas_Arab`` for ``zho_Hans`` / ``pes_Arab``.

Where rows come from (one code path: ``datasets.load_dataset(..., streaming=True)``):

1. ``local`` given: a local directory in the hub's own layout (`LAYOUTS`), read with the
   ``parquet`` / ``json`` / ``text`` builder of `datasets` over exactly the files the hub config
   names; see `hybridlab.data.local_sources` for the config keys.
2. else, in offline mode (``HF_HUB_OFFLINE=1``): the dataset's snapshot in the Hugging Face cache
   (``huggingface-cli download <repo> --repo-type dataset`` wrote it; same layout), read as in 1.
3. else the hub, by name and config.

Source facts this module relies on (checked against the sources named in `languages`):

* FLoRes+ ``openlanguagedata/flores_plus``: gated; config per language; files ``dev/<config>.parquet``
  and ``devtest/<config>.parquet``; columns ``id`` (sentence number, from 1, shared by all
  languages), ``text`` and metadata. ``sid`` = ``id`` (row order + 1 if a copy lacks ``id``).
* FLORES-200 release ``flores200_dataset/{dev,devtest}/<code>.{dev,devtest}``: one sentence per
  line, line i parallel across languages; ``sid`` = line number (from 1, as FLoRes+ ``id``). A local
  copy may hold ``<code>.<split>.xz`` instead (the repository ships ``data/flores200`` that way).
* NTREX-128 (Federmann et al. 2022; local copies only, e.g. the shipped ``data/ntrex128``):
  ``newstest2019-ref.<name>.txt`` per language, English as ``newstest2019-src.eng.txt`` (each may be
  ``.xz``-compressed), 1,997 sentences of 123 WMT19 news articles in article order, line i parallel.
  Read as monolingual training text: consecutive sentences are grouped into documents.
* FineWeb-2 ``HuggingFaceFW/fineweb-2``: ``data/<config>/{train,test}/*.parquet``, columns ``text``,
  ``id`` (+ metadata). No English.
* FineWeb ``HuggingFaceFW/fineweb``: config ``sample-10BT`` = ``sample/10BT/*.parquet``, a dump
  config ``CC-MAIN-2024-10`` = ``data/CC-MAIN-2024-10/*.parquet``; columns ``text``, ``id``.
* DCLM ``mlfoundations/dclm-baseline-1.0``: ``global-shard_XX_of_10/local-shard_X_of_10/
  shard_XXXXXXXX_processed.jsonl.zst`` (reading ``.zst`` needs the ``zstandard`` package), field
  ``text``, no id: doc ids come from row order.
* PG-19 (Rae et al. 2019; long books for per-position loss): ``deepmind/pg19`` is a loading-script
  dataset (``pg19.py`` reading DeepMind's storage bucket), which ``datasets`` >= 4 no longer runs, so
  the loader reads the Parquet copy ``fla-hub/pg19``: same features (``short_book_title``,
  ``publication_date``, ``url``, ``text``) and splits (train 28,602 / validation 50 / test 100 books),
  files ``data/<split>-*.parquet``; ``doc_id`` = ``url`` (one Gutenberg book each).

Only sids present in every language are kept. Streams take the first ``n_docs`` non-empty documents
(empty texts are skipped and counted in the log); a stream that ends early returns what exists, with
a warning.
"""

from __future__ import annotations

import logging
import lzma
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
from datasets import load_dataset
from datasets.exceptions import DatasetsError

from hybridlab.data.languages import dataset_config
from hybridlab.errors import HybridlabError

log = logging.getLogger(__name__)

FLORES = "openlanguagedata/flores_plus"
FINEWEB2 = "HuggingFaceFW/fineweb-2"
FINEWEB = "HuggingFaceFW/fineweb"
FINEWEB_CONFIG = "sample-10BT"
DCLM = "mlfoundations/dclm-baseline-1.0"
PG19 = "fla-hub/pg19"  # Parquet copy of deepmind/pg19 (a loading script datasets >= 4 cannot run)
PG19_SPLITS = ("train", "validation", "test")
ENGLISH = "eng_Latn"
HUB_NAMES = {"flores_plus": FLORES, "fineweb2": FINEWEB2, "fineweb": FINEWEB, "dclm": DCLM, "pg19": PG19}
FLORES_SPLITS = ("dev", "devtest")

PARALLEL_SCHEMA = {"sid": pl.Int64, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8}
MONO_SCHEMA = {"doc_id": pl.Utf8, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8}


# ------------------------------------------------------------------------------- local hub layouts

def _flores_plus_files(root: Path, config: str | None, split: str) -> tuple[str, list[Path], str]:
    return "parquet", sorted((root / split).glob(f"{config}.parquet")), f"{split}/{config}.parquet"


def _plain_or_xz(folder: Path, names: list[str]) -> list[Path]:
    """The first of `names` in `folder` that exists as a file, plain before ``.xz``-compressed; [] if none."""
    for name in names:
        for path in (folder / name, folder / f"{name}.xz"):
            if path.is_file():
                return [path]
    return []


def _flores200_files(root: Path, config: str | None, split: str) -> tuple[str, list[Path], str]:
    return "text", _plain_or_xz(root / split, [f"{config}.{split}"]), f"{split}/{config}.{split}[.xz]"


def _ntrex128_files(root: Path, config: str | None, split: str) -> tuple[str, list[Path], str]:
    # references are newstest2019-ref.<name>.txt; NTREX's English is the source, newstest2019-src.eng.txt
    names = [f"newstest2019-ref.{config}.txt", f"newstest2019-src.{config}.txt"]
    return "text", _plain_or_xz(root, names), f"newstest2019-ref.{config}.txt[.xz]"


def _fineweb2_files(root: Path, config: str | None, split: str) -> tuple[str, list[Path], str]:
    return "parquet", sorted((root / "data" / str(config) / split).glob("*.parquet")), f"data/{config}/{split}/*.parquet"


def _fineweb_folder(config: str | None) -> str:
    m = re.fullmatch(r"sample-(\d+BT)", config or "")
    if m:
        return f"sample/{m.group(1)}"
    return "data/*" if config in (None, "default") else f"data/{config}"


def _fineweb_files(root: Path, config: str | None, split: str) -> tuple[str, list[Path], str]:
    folder = _fineweb_folder(config)
    return "parquet", sorted(root.glob(f"{folder}/*.parquet")), f"{folder}/*.parquet"


def _dclm_files(root: Path, config: str | None, split: str) -> tuple[str, list[Path], str]:
    pattern = "global-shard_*/local-shard_*/*.jsonl"
    files = sorted([*root.glob(pattern), *root.glob(pattern + ".zst")])
    return "json", files, f"{pattern}[.zst]"


def _pg19_files(root: Path, config: str | None, split: str) -> tuple[str, list[Path], str]:
    return "parquet", sorted((root / "data").glob(f"{split}-*.parquet")), f"data/{split}-*.parquet"


# dataset key -> (root, config, split) -> (datasets builder, files, the layout it expects)
LAYOUTS: dict[str, Callable[[Path, str | None, str], tuple[str, list[Path], str]]] = {
    "flores_plus": _flores_plus_files, "flores200": _flores200_files, "fineweb2": _fineweb2_files,
    "fineweb": _fineweb_files, "dclm": _dclm_files, "pg19": _pg19_files, "ntrex128": _ntrex128_files,
}


def _cached_snapshot(dataset: str) -> Path | None:
    """The dataset's snapshot directory in the HF cache when the hub is offline, else None (use the hub)."""
    import huggingface_hub
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE or dataset not in HUB_NAMES:
        return None
    name = HUB_NAMES[dataset]
    try:
        return Path(huggingface_hub.snapshot_download(name, repo_type="dataset", local_files_only=True))
    except Exception:  # noqa: BLE001 - every failure means "not in the cache"
        raise HybridlabError(
            f"{name} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and the hub is offline "
            f"(HF_HUB_OFFLINE=1); download it with network first (huggingface-cli download {name} "
            f"--repo-type dataset), or point local_sources.{dataset} at a local copy") from None


def _xz_text_rows(files: list[Path]) -> Iterator[dict]:
    """Rows of xz-compressed text files exactly as the `datasets` "text" builder yields plain ones: one
    ``{"text": line}`` per line (universal newlines, line break removed, empty lines kept)."""
    for path in files:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                yield {"text": line.rstrip("\n")}


def iter_rows(dataset: str, config: str | None, split: str, *, local: str | Path | None = None,
              token: str | None = None) -> Iterator[dict]:
    """Stream the rows of one config/split of `dataset` (a `LAYOUTS` key) from `local`, the cache or the hub."""
    root = Path(local) if local is not None else _cached_snapshot(dataset)
    if root is not None:
        if not root.is_dir():
            raise HybridlabError(f"local copy of {dataset} '{root}' is not a directory; fix local_sources.{dataset}")
        builder, files, expected = LAYOUTS[dataset](root, config, split)
        if not files:
            raise HybridlabError(f"local copy of {dataset} '{root}' has no {expected} (config {config!r}, "
                                 f"split {split!r}); write the files in the hub's layout or fix the name")
        try:
            if builder == "text" and files[0].suffix == ".xz":
                yield from _xz_text_rows(files)
            else:
                yield from load_dataset(builder, data_files={split: [str(f) for f in files]}, split=split,
                                        streaming=True)
        except (DatasetsError, ValueError, OSError, ImportError, lzma.LZMAError) as err:
            detail = " ".join(str(err).split())[:160]
            raise HybridlabError(f"local copy of {dataset} '{root}': cannot read {expected} "
                                 f"({type(err).__name__}: {detail}); rewrite the files") from err
        return
    name = HUB_NAMES[dataset]
    try:
        # Streaming defers downloads (and gated-access checks) to the first row, so iterate inside the try.
        yield from load_dataset(name, config, split=split, streaming=True, token=token)
    except (DatasetsError, ValueError, OSError, ImportError) as err:
        detail = " ".join(str(err).split())[:200]
        raise HybridlabError(
            f"{name} config {config!r} split {split!r} could not be loaded ({type(err).__name__}: {detail}); "
            f"check the config/split name, the network (HF_HUB_OFFLINE), and for gated data set HF_TOKEN or run "
            f"`huggingface-cli login` and accept the terms at https://huggingface.co/datasets/{name}") from err


# ------------------------------------------------------------------------------------ parallel text

def _flores_token(token: str | None) -> str:
    import huggingface_hub

    token = token or huggingface_hub.get_token()
    if not token:
        raise HybridlabError(
            f"{FLORES} is gated and no Hugging Face token was found; set HF_TOKEN (or run `huggingface-cli login`) "
            f"after accepting the terms at https://huggingface.co/datasets/{FLORES}, or set local_sources.flores_plus"
        )
    return token


def _check_parallel_args(languages: list[str], split: str) -> None:
    if split not in FLORES_SPLITS:
        raise HybridlabError(f"FLoRes split {split!r} does not exist; use 'dev' or 'devtest'")
    if not languages or len(set(languages)) != len(languages):
        raise HybridlabError(f"FLoRes languages {languages} must be a non-empty list without duplicates")


def _intersect(frames: list[pl.DataFrame], languages: list[str], what: str) -> pl.DataFrame:
    df = pl.concat(frames)
    n = len(languages)
    common = df.group_by("sid").agg(pl.len().alias("n")).filter(pl.col("n") == n)["sid"]
    if common.len() == 0:
        raise HybridlabError(f"{what}: no sentence id is shared by all of {languages}; check the languages")
    dropped = df["sid"].n_unique() - common.len()
    if dropped:
        log.warning("%s: dropped %d sentence ids missing in some of %s", what, dropped, languages)
    order = {lang: i for i, lang in enumerate(languages)}
    return (df.filter(pl.col("sid").is_in(common.implode()))
            .with_columns(pl.col("lang").replace_strict(order, return_dtype=pl.Int64).alias("_o"))
            .sort("sid", "_o").drop("_o"))


def _parallel_frame(sids: list[int], lang: str, texts: list[str], source: str) -> pl.DataFrame:
    return pl.DataFrame({"sid": sids, "lang": [lang] * len(sids), "text": texts, "source": [source] * len(sids)},
                        schema=PARALLEL_SCHEMA)


def load_flores(languages: list[str], split: str, *, local: str | Path | None = None,
                token: str | None = None) -> pl.DataFrame:
    """FLoRes+ `split` for `languages` (project codes) in the parallel schema, sids shared by all languages."""
    _check_parallel_args(languages, split)
    configs = {lang: dataset_config(lang, "flores_plus") for lang in languages}
    if local is None and _cached_snapshot("flores_plus") is None:
        token = _flores_token(token)
    where = local if local is not None else FLORES
    frames = []
    for lang, config in configs.items():
        rows = list(iter_rows("flores_plus", config, split, local=local, token=token))
        if not rows:
            raise HybridlabError(f"{where} config {config!r} split {split!r} is empty; check the copy")
        if "text" not in rows[0]:
            raise HybridlabError(f"{where} config {config!r} has no 'text' column (columns: {sorted(rows[0])})")
        sids = [int(r["id"]) for r in rows] if "id" in rows[0] else list(range(1, len(rows) + 1))
        if len(set(sids)) != len(sids):
            raise HybridlabError(f"{where} config {config!r} split {split!r} repeats sentence ids; the copy is corrupt")
        frames.append(_parallel_frame(sids, lang, [r["text"] for r in rows], f"flores_plus/{split}"))
    return _intersect(frames, languages, f"FLoRes+ {split}")


def load_flores200(languages: list[str], split: str, *, local: str | Path) -> pl.DataFrame:
    """The FLORES-200 text release (`{split}/<code>.{split}`, line i parallel) in the parallel schema."""
    _check_parallel_args(languages, split)
    frames, lengths = [], {}
    for lang in languages:
        code = dataset_config(lang, "flores200")
        texts = [r["text"] for r in iter_rows("flores200", code, split, local=local)]
        lengths[lang] = len(texts)
        frames.append(_parallel_frame(list(range(1, len(texts) + 1)), lang, texts, f"flores200/{split}"))
    if len(set(lengths.values())) != 1:
        raise HybridlabError(f"FLORES-200 {split} at {local}: files have different line counts {lengths}; "
                             f"line i must be the same sentence in every language, so the copy is corrupt")
    return _intersect(frames, languages, f"FLORES-200 {split}")


# ------------------------------------------------------------------------------- monolingual text

def stream_docs(dataset: str, config: str | None, n_docs: int, *, lang: str, source: str,
                local: str | Path | None = None, split: str = "train", text_column: str = "text",
                id_column: str | None = "id", token: str | None = None) -> pl.DataFrame:
    """First `n_docs` non-empty documents of one config of `dataset`, in the mono schema.

    ``doc_id`` is the `id_column` value, or ``"<source>/<lang>/<row>"`` when `id_column` is None
    (datasets without ids, e.g. DCLM).
    """
    if n_docs < 1:
        raise HybridlabError(f"stream_docs: n_docs={n_docs} must be >= 1")
    where = local if local is not None else HUB_NAMES.get(dataset, dataset)
    doc_ids, texts, n_empty = [], [], 0
    for i, row in enumerate(iter_rows(dataset, config, split, local=local, token=token)):
        if text_column not in row:
            raise HybridlabError(f"{where} config {config!r} has no column {text_column!r} (columns: {sorted(row)})")
        if id_column is not None and id_column not in row:
            raise HybridlabError(
                f"{where} config {config!r} has no id column {id_column!r} (columns: {sorted(row)}); pass id_column=None")
        text = row[text_column]
        if text is None or not text.strip():
            n_empty += 1
            continue
        doc_ids.append(str(row[id_column]) if id_column is not None else f"{source}/{lang}/{i}")
        texts.append(text)
        if len(texts) == n_docs:
            break
    if n_empty:
        log.info("%s %s: skipped %d empty documents", where, config, n_empty)
    if len(texts) < n_docs:
        log.warning("%s %s: stream ended after %d of %d requested documents", where, config, len(texts), n_docs)
    return pl.DataFrame({"doc_id": doc_ids, "lang": [lang] * len(texts), "text": texts,
                         "source": [source] * len(texts)}, schema=MONO_SCHEMA)


def load_fineweb2(languages: list[str], n_docs: int, *, local: str | Path | None = None, split: str = "train",
                  token: str | None = None) -> pl.DataFrame:
    """First `n_docs` FineWeb-2 documents per language (project codes; configs from the registry)."""
    if ENGLISH in languages:
        raise HybridlabError(f"FineWeb-2 has no {ENGLISH}; drop it from the languages and use load_english_web for English")
    frames = [stream_docs("fineweb2", dataset_config(lang, "fineweb2"), n_docs, split=split, lang=lang,
                          source="fineweb2", local=local, token=token) for lang in languages]
    return pl.concat(frames) if frames else pl.DataFrame(schema=MONO_SCHEMA)


def load_english_web(n_docs: int, source: str = "fineweb", *, local: str | Path | None = None,
                     config: str | None = None, token: str | None = None) -> pl.DataFrame:
    """English web documents from FineWeb (``sample-10BT`` by default) or DCLM, mono schema, lang eng_Latn."""
    if source == "fineweb":
        cfg, id_column = config or FINEWEB_CONFIG, "id"
    elif source == "dclm":
        cfg, id_column = config, None
    else:
        raise HybridlabError(f"English web source {source!r} is unknown; use 'fineweb' or 'dclm'")
    return stream_docs(source, cfg, n_docs, id_column=id_column, lang=ENGLISH, source=source, local=local,
                       token=token)


def load_ntrex128(languages: list[str], *, local: str | Path, sentences_per_doc: int = 16) -> pl.DataFrame:
    """NTREX-128 text of `languages` (project codes, English included) in the mono schema: each file's
    sentences in file order, `sentences_per_doc` consecutive ones per document joined by newlines (the
    file is whole news articles in order, so a document keeps neighbouring sentences together).

    ``doc_id`` is ``ntrex128:<lang>:<k>`` (k from 0); empty lines are skipped.
    """
    if sentences_per_doc < 1:
        raise HybridlabError(f"NTREX-128: sentences_per_doc={sentences_per_doc} must be >= 1")
    if not languages or len(set(languages)) != len(languages):
        raise HybridlabError(f"NTREX-128 languages {languages} must be a non-empty list without duplicates")
    names = {lang: dataset_config(lang, "ntrex128") for lang in languages}  # one-line error if NTREX lacks one
    doc_ids, langs, texts = [], [], []
    for lang, name in names.items():
        lines = [r["text"] for r in iter_rows("ntrex128", name, "test", local=local)]
        sentences = [s for s in lines if s.strip()]
        if len(sentences) < len(lines):
            log.info("NTREX-128 %s: skipped %d empty lines", name, len(lines) - len(sentences))
        for k, start in enumerate(range(0, len(sentences), sentences_per_doc)):
            doc_ids.append(f"ntrex128:{lang}:{k}")
            langs.append(lang)
            texts.append("\n".join(sentences[start:start + sentences_per_doc]))
    return pl.DataFrame({"doc_id": doc_ids, "lang": langs, "text": texts, "source": ["ntrex128"] * len(texts)},
                        schema=MONO_SCHEMA)


def load_pg19(n_books: int, split: str = "test", *, local: str | Path | None = None,
              token: str | None = None) -> pl.DataFrame:
    """The first `n_books` PG-19 books of `split` (one document each), mono schema, lang eng_Latn."""
    if split not in PG19_SPLITS:
        raise HybridlabError(f"PG-19 split {split!r} does not exist; use one of {', '.join(PG19_SPLITS)}")
    return stream_docs("pg19", None, n_books, split=split, id_column="url", lang=ENGLISH, source=f"pg19/{split}",
                       local=local, token=token)


def write_frames(frames: Iterator[pl.DataFrame], path: str | Path, schema: dict) -> dict[str, int]:
    """Write `frames` (each with `schema`) one after another into one parquet file at `path`, holding one
    frame at a time; returns the rows per ``lang``. Read back it is the frames' concatenation."""
    import pyarrow.parquet as pq

    counts: dict[str, int] = {}
    writer = None
    try:
        for df in frames:
            table = df.cast(schema).to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(str(path), table.schema, compression="zstd")
            writer.write_table(table)
            for lang, n in df.group_by("lang").len().rows():
                counts[lang] = counts.get(lang, 0) + n
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        pl.DataFrame(schema=schema).write_parquet(path)
    return counts
