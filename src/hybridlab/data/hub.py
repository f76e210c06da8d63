"""Hugging Face hub loaders for the `paper` preset: FLoRes+, FineWeb-2, FineWeb and DCLM.

Every loader goes through ``datasets.load_dataset(..., streaming=True)`` and returns polars frames in
the project's shared schemas (the offline builder writes the same ones):

* parallel: ``sid: Int64, lang: Utf8, text: Utf8, source: Utf8`` (long format, one row per sid x lang)
* mono:     ``doc_id: Utf8, lang: Utf8, text: Utf8, source: Utf8``

``path_or_name`` is either a hub dataset name or a LOCAL directory laid out as
``<dir>/<config>/<split>.parquet`` (or shards ``<dir>/<config>/<split>-*.parquet``; ``default`` when the
dataset has no config). A local directory is read with the ``parquet`` builder of `datasets`, so tests
run the same streaming/row code path as the hub without network.

Source facts this module relies on:

* FLoRes+ ``openlanguagedata/flores_plus``: gated, one config per language (``eng_Latn``), splits
  ``dev``/``devtest``; rows carry ``id`` (sentence number shared by all languages), ``text`` and
  metadata (``iso_639_3``, ``iso_15924``, ``glottocode``, ``url``, ``domain``, ``topic``, ...).
  ``sid`` = ``id`` (row order if a copy lacks ``id``). Only sids present in every language are kept.
* FineWeb-2 ``HuggingFaceFW/fineweb-2``: config per language (``tel_Telu``), split ``train``, columns
  ``text`` and ``id``. It has no English.
* English web text: FineWeb ``HuggingFaceFW/fineweb`` (config ``sample-10BT``, ``text``/``id``) or DCLM
  ``mlfoundations/dclm-baseline-1.0`` (``text``, no id column: doc ids come from row order).

Streams take the first ``n_docs`` non-empty documents (empty/whitespace-only texts are skipped and
counted in the log). A stream that ends early returns what exists, with a warning; packing records
the achieved shares.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import polars as pl
from datasets import load_dataset
from datasets.exceptions import DatasetsError

from hybridlab.errors import HybridlabError

log = logging.getLogger(__name__)

FLORES = "openlanguagedata/flores_plus"
FINEWEB2 = "HuggingFaceFW/fineweb-2"
FINEWEB = "HuggingFaceFW/fineweb"
FINEWEB_CONFIG = "sample-10BT"
DCLM = "mlfoundations/dclm-baseline-1.0"
ENGLISH = "eng_Latn"

PARALLEL_SCHEMA = {"sid": pl.Int64, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8}
MONO_SCHEMA = {"doc_id": pl.Utf8, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8}


def _local_files(root: Path, config: str | None, split: str) -> list[str]:
    folder = root / (config or "default")
    files = sorted(folder.glob(f"{split}.parquet")) + sorted(folder.glob(f"{split}-*.parquet"))
    if not files:
        raise HybridlabError(
            f"local dataset {root}: no {folder.name}/{split}.parquet (or {split}-*.parquet shards); "
            f"write the files in that layout or fix the config/split name"
        )
    return [str(f) for f in files]


def _hub_hint(dataset: str, config: str | None, split: str, err: Exception) -> HybridlabError:
    detail = " ".join(str(err).split())[:200]
    return HybridlabError(
        f"{dataset} config {config!r} split {split!r} could not be loaded ({type(err).__name__}: {detail}); "
        f"check the config/split name, the network (HF_HUB_OFFLINE), and for gated data set HF_TOKEN or run "
        f"`huggingface-cli login` and accept the terms at https://huggingface.co/datasets/{dataset}"
    )


def iter_rows(
    path_or_name: str | Path, config: str | None, split: str, *, token: str | None = None
) -> Iterator[dict]:
    """Stream the rows of one config/split, from the hub or a local directory (same `datasets` path)."""
    root = Path(path_or_name)
    if root.is_dir():
        files = _local_files(root, config, split)
        try:
            yield from load_dataset("parquet", data_files={split: files}, split=split, streaming=True)
        except (DatasetsError, ValueError, OSError) as err:
            raise HybridlabError(f"local dataset {root}: cannot read {files} ({type(err).__name__}); rewrite them as parquet") from err
        return
    name = str(path_or_name)
    try:
        ds = load_dataset(name, config, split=split, streaming=True, token=token)
        # Streaming defers downloads (and gated-access checks) to the first row, so iterate inside the try.
        yield from ds
    except (DatasetsError, ValueError, OSError) as err:
        raise _hub_hint(name, config, split, err) from err


def _flores_token(token: str | None) -> str:
    import huggingface_hub

    token = token or huggingface_hub.get_token()
    if not token:
        raise HybridlabError(
            f"{FLORES} is gated and no Hugging Face token was found; set HF_TOKEN (or run `huggingface-cli login`) "
            f"after accepting the terms at https://huggingface.co/datasets/{FLORES}"
        )
    return token


def load_flores(
    languages: list[str],
    split: str,
    *,
    path_or_name: str | Path = FLORES,
    token: str | None = None,
) -> pl.DataFrame:
    """FLoRes+ `split` for `languages` in the parallel schema, keeping sids present in all languages."""
    if split not in ("dev", "devtest"):
        raise HybridlabError(f"FLoRes+ split {split!r} does not exist; use 'dev' or 'devtest'")
    if not languages or len(set(languages)) != len(languages):
        raise HybridlabError(f"FLoRes+ languages {languages} must be a non-empty list without duplicates")
    if not Path(path_or_name).is_dir():
        token = _flores_token(token)
    source = f"flores_plus/{split}"
    frames = []
    for lang in languages:
        rows = list(iter_rows(path_or_name, lang, split, token=token))
        if not rows:
            raise HybridlabError(f"{path_or_name} config {lang!r} split {split!r} is empty; check the language code")
        if "text" not in rows[0]:
            raise HybridlabError(f"{path_or_name} config {lang!r} has no 'text' column (columns: {sorted(rows[0])})")
        sids = [int(r["id"]) for r in rows] if "id" in rows[0] else list(range(len(rows)))
        if len(set(sids)) != len(sids):
            raise HybridlabError(f"{path_or_name} config {lang!r} split {split!r} repeats sentence ids; the copy is corrupt")
        frames.append(
            pl.DataFrame(
                {"sid": sids, "lang": [lang] * len(rows), "text": [r["text"] for r in rows], "source": [source] * len(rows)},
                schema=PARALLEL_SCHEMA,
            )
        )
    df = pl.concat(frames)
    n = len(languages)
    common = df.group_by("sid").agg(pl.len().alias("n")).filter(pl.col("n") == n)["sid"]
    if common.len() == 0:
        raise HybridlabError(f"FLoRes+ {split}: no sentence id is shared by all of {languages}; check the languages")
    dropped = df["sid"].n_unique() - common.len()
    if dropped:
        log.warning("FLoRes+ %s: dropped %d sentence ids missing in some of %s", split, dropped, languages)
    order = {lang: i for i, lang in enumerate(languages)}
    return (
        df.filter(pl.col("sid").is_in(common.implode()))
        .with_columns(pl.col("lang").replace_strict(order, return_dtype=pl.Int64).alias("_o"))
        .sort("sid", "_o")
        .drop("_o")
    )


def stream_docs(
    dataset: str | Path,
    config: str | None,
    n_docs: int,
    *,
    split: str = "train",
    text_column: str = "text",
    id_column: str | None = "id",
    lang: str,
    source: str,
    token: str | None = None,
) -> pl.DataFrame:
    """First `n_docs` non-empty documents of a (hub or local) dataset, in the mono schema.

    `dataset` is a hub name or a local directory. ``doc_id`` is the `id_column` value, or
    ``"<source>/<lang>/<row>"`` when `id_column` is None (datasets without ids, e.g. DCLM).
    """
    if n_docs < 1:
        raise HybridlabError(f"stream_docs: n_docs={n_docs} must be >= 1")
    doc_ids, texts = [], []
    n_empty = 0
    for i, row in enumerate(iter_rows(dataset, config, split, token=token)):
        if text_column not in row:
            raise HybridlabError(f"{dataset} config {config!r} has no column {text_column!r} (columns: {sorted(row)})")
        if id_column is not None and id_column not in row:
            raise HybridlabError(
                f"{dataset} config {config!r} has no id column {id_column!r} (columns: {sorted(row)}); pass id_column=None"
            )
        text = row[text_column]
        if text is None or not text.strip():
            n_empty += 1
            continue
        doc_ids.append(str(row[id_column]) if id_column is not None else f"{source}/{lang}/{i}")
        texts.append(text)
        if len(texts) == n_docs:
            break
    if n_empty:
        log.info("%s %s: skipped %d empty documents", dataset, config, n_empty)
    if len(texts) < n_docs:
        log.warning("%s %s: stream ended after %d of %d requested documents", dataset, config, len(texts), n_docs)
    return pl.DataFrame(
        {"doc_id": doc_ids, "lang": [lang] * len(texts), "text": texts, "source": [source] * len(texts)},
        schema=MONO_SCHEMA,
    )


def load_fineweb2(
    languages: list[str],
    n_docs: int,
    *,
    path_or_name: str | Path = FINEWEB2,
    split: str = "train",
    token: str | None = None,
) -> pl.DataFrame:
    """First `n_docs` FineWeb-2 documents per language (config = language code), mono schema."""
    if ENGLISH in languages:
        raise HybridlabError(f"FineWeb-2 has no {ENGLISH}; drop it from the languages and use load_english_web for English")
    frames = [
        stream_docs(path_or_name, lang, n_docs, split=split, lang=lang, source="fineweb2", token=token)
        for lang in languages
    ]
    return pl.concat(frames) if frames else pl.DataFrame(schema=MONO_SCHEMA)


def load_english_web(
    n_docs: int,
    source: str = "fineweb",
    *,
    path_or_name: str | Path | None = None,
    config: str | None = None,
    token: str | None = None,
) -> pl.DataFrame:
    """English web documents from FineWeb (``sample-10BT`` by default) or DCLM, mono schema, lang eng_Latn."""
    if source == "fineweb":
        name, cfg, id_column = FINEWEB, config or FINEWEB_CONFIG, "id"
    elif source == "dclm":
        name, cfg, id_column = DCLM, config, None
    else:
        raise HybridlabError(f"English web source {source!r} is unknown; use 'fineweb' or 'dclm'")
    return stream_docs(
        path_or_name if path_or_name is not None else name,
        cfg,
        n_docs,
        id_column=id_column,
        lang=ENGLISH,
        source=source,
        token=token,
    )
