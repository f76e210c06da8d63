"""Local copies in each hub's exact layout, built from a corpus in the project's schema (the offline one).

The rehearsal preset runs the paper preset's hub loaders (`hybridlab.data.hub`) over directories that
look like the hub datasets: same paths, config names (from the language registry) and columns. This
module writes them from ``parallel.parquet`` / ``mono.parquet`` (`offline.PARALLEL_SCHEMA`,
`offline.MONO_SCHEMA`):

* ``flores_plus/<split>/<config>.parquet``: FLoRes+ columns (``id``, ``text``, ``iso_639_3``, ...), the parallel corpus;
* ``flores200/<split>/<code>.<split>``: the FLORES-200 release, one sentence per line, line i parallel;
* ``fineweb-2/data/<config>/train/000_0000<k>.parquet``: FineWeb-2 columns, the non-English mono documents;
* ``fineweb/sample/10BT/<k>_00000.parquet``: FineWeb config ``sample-10BT``, the English documents;
* ``dclm/global-shard_01_of_10/local-shard_0_of_10/shard_<k>_processed.jsonl.zst``: DCLM, the English documents.

Definitions: only sentences present in every language are written, their sids renumbered 1..n in sid
order (FLoRes+ numbers its sentences from 1, and a FLORES-200 line number is the same id), so both
parallel copies load back with equal sids. Documents
keep their corpus order and are dealt round-robin over ``shards`` files. DCLM shards are zstd-compressed
when the ``zstandard`` package is installed (the hub's ``.jsonl.zst``), plain ``.jsonl`` otherwise (the
loader reads both). Metadata columns the loaders do not read get placeholder values. A language without
a config in a dataset, or two languages sharing one config (FineWeb-2's ``cmn_Hani``), is a one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from hybridlab.data.languages import ENGLISH, dataset_config, get_language
from hybridlab.errors import HybridlabError

DIRS = {"flores_plus": "flores_plus", "flores200": "flores200", "fineweb2": "fineweb-2", "fineweb": "fineweb",
        "dclm": "dclm"}


def _configs(codes: list[str], dataset: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for code in codes:
        name = dataset_config(code, dataset)
        if name in out.values():
            other = next(c for c, n in out.items() if n == name)
            raise HybridlabError(f"hub layout: {other} and {code} are both config '{name}' of {dataset}; "
                                 f"keep one of them in the corpus")
        out[code] = name
    return out


def _shards(df: pl.DataFrame, shards: int) -> list[pl.DataFrame]:
    idx = pl.int_range(pl.len()) % shards
    return [part for k in range(min(shards, df.height))
            if (part := df.filter(idx == k)).height]


def complete_parallel(parallel: pl.DataFrame) -> pl.DataFrame:
    """The rows of sentences present in every language, sids renumbered 1..n in sid order."""
    n_langs = parallel["lang"].n_unique()
    common = sorted(parallel.group_by("sid").len().filter(pl.col("len") == n_langs)["sid"].to_list())
    renumber = {s: i + 1 for i, s in enumerate(common)}
    return (parallel.filter(pl.col("sid").is_in(common))
            .with_columns(pl.col("sid").replace_strict(renumber, return_dtype=pl.Int64)).sort("sid", "lang"))


def write_flores_plus(parallel: pl.DataFrame, root: Path, split: str) -> None:
    """FLoRes+ mirror: ``<split>/<config>.parquet`` with the dataset's columns (`parallel` complete, sids from 1)."""
    codes = sorted(set(parallel["lang"].to_list()))
    for code, config in _configs(codes, "flores_plus").items():
        rows = parallel.filter(pl.col("lang") == code).sort("sid")
        lang = get_language(code)
        n = rows.height
        frame = pl.DataFrame({
            "id": rows["sid"].to_list(), "iso_639_3": [config.split("_")[0]] * n,
            "iso_15924": [lang.script] * n, "glottocode": [""] * n, "text": rows["text"].to_list(),
            "url": [""] * n, "domain": [""] * n, "topic": [""] * n, "has_image": [0] * n,
            "has_hyperlink": [0] * n, "last_updated": ["offline"] * n,
        }, schema_overrides={"id": pl.Int64})
        (root / split).mkdir(parents=True, exist_ok=True)
        frame.write_parquet(root / split / f"{config}.parquet")


def write_flores200(parallel: pl.DataFrame, root: Path, split: str) -> None:
    """FLORES-200 text release: ``<split>/<code>.<split>``, one sentence per line (`parallel` complete)."""
    codes = sorted(set(parallel["lang"].to_list()))
    (root / split).mkdir(parents=True, exist_ok=True)
    for code, name in _configs(codes, "flores200").items():
        texts = parallel.filter(pl.col("lang") == code).sort("sid")["text"].to_list()
        bad = [t for t in texts if "\n" in t or "\r" in t]
        if bad:
            raise HybridlabError(f"hub layout: a {code} sentence has a line break ({bad[0][:40]!r}); the FLORES-200 "
                                 f"text layout is one sentence per line")
        (root / split / f"{name}.{split}").write_text("".join(t + "\n" for t in texts), encoding="utf-8")


def write_fineweb2(mono: pl.DataFrame, root: Path, shards: int) -> None:
    """FineWeb-2: ``data/<config>/train/000_0000<k>.parquet`` with the dataset's columns."""
    codes = [c for c in dict.fromkeys(mono["lang"].to_list()) if c != ENGLISH]
    for code, config in _configs(codes, "fineweb2").items():
        docs = mono.filter(pl.col("lang") == code)
        iso, script = config.split("_")
        folder = root / "data" / config / "train"
        folder.mkdir(parents=True, exist_ok=True)
        for k, part in enumerate(_shards(docs, shards)):
            n = part.height
            pl.DataFrame({
                "text": part["text"].to_list(), "id": part["doc_id"].to_list(), "dump": ["offline"] * n,
                "url": [""] * n, "date": [""] * n, "file_path": [""] * n, "language": [iso] * n,
                "language_score": [1.0] * n, "language_script": [script] * n, "minhash_cluster_size": [1] * n,
                "top_langs": ["{}"] * n,
            }).write_parquet(folder / f"000_{k:05d}.parquet")


def write_fineweb(english: pl.DataFrame, root: Path, shards: int) -> None:
    """FineWeb config sample-10BT: ``sample/10BT/<k>_00000.parquet`` with the dataset's columns."""
    folder = root / "sample" / "10BT"
    folder.mkdir(parents=True, exist_ok=True)
    for k, part in enumerate(_shards(english, shards)):
        n = part.height
        pl.DataFrame({
            "text": part["text"].to_list(), "id": part["doc_id"].to_list(), "dump": ["offline"] * n,
            "url": [""] * n, "date": [""] * n, "file_path": [""] * n, "language": ["en"] * n,
            "language_score": [1.0] * n, "token_count": [len(t.split()) for t in part["text"].to_list()],
        }).write_parquet(folder / f"{k:03d}_00000.parquet")


def write_dclm(english: pl.DataFrame, root: Path, shards: int) -> list[Path]:
    """DCLM-baseline: ``global-shard_01_of_10/local-shard_0_of_10/shard_<k>_processed.jsonl[.zst]``."""
    try:
        import zstandard
    except ImportError:
        zstandard = None
    folder = root / "global-shard_01_of_10" / "local-shard_0_of_10"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for k, part in enumerate(_shards(english, shards)):
        lines = "".join(json.dumps({"text": t, "url": "", "metadata": {}}, ensure_ascii=False) + "\n"
                        for t in part["text"].to_list()).encode()
        path = folder / f"shard_{k:08d}_processed.jsonl"
        if zstandard is not None:
            path = path.with_name(path.name + ".zst")
            lines = zstandard.ZstdCompressor().compress(lines)
        path.write_bytes(lines)
        written.append(path)
    return written


def write_hub_layout(parallel: pl.DataFrame, mono: pl.DataFrame, out: str | Path, *, split: str = "devtest",
                     shards: int = 2) -> dict[str, Path]:
    """Write every hub layout under `out` (see the module table); returns {local_sources key: directory}."""
    if split not in ("dev", "devtest"):
        raise HybridlabError(f"hub layout: FLoRes split {split!r} does not exist; use 'dev' or 'devtest'")
    if shards < 1:
        raise HybridlabError(f"hub layout: shards={shards} must be >= 1")
    for name, df, cols in (("parallel", parallel, {"sid", "lang", "text"}), ("mono", mono, {"doc_id", "lang", "text"})):
        if not cols <= set(df.columns):
            raise HybridlabError(f"hub layout: the {name} corpus lacks columns {sorted(cols - set(df.columns))}; "
                                 f"pass the corpus step's {name}.parquet")
    english = mono.filter(pl.col("lang") == ENGLISH)
    if english.height == 0:
        raise HybridlabError(f"hub layout: the mono corpus has no {ENGLISH} documents for FineWeb/DCLM")
    out = Path(out)
    dirs = {key: out / name for key, name in DIRS.items()}
    parallel = complete_parallel(parallel)
    write_flores_plus(parallel, dirs["flores_plus"], split)
    write_flores200(parallel, dirs["flores200"], split)
    write_fineweb2(mono, dirs["fineweb2"], shards)
    write_fineweb(english, dirs["fineweb"], shards)
    write_dclm(english, dirs["dclm"], shards)
    return dirs
