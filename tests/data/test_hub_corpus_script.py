"""The paper preset's corpus step (workflow_scripts/build_hub_corpus.py) on local copies in hub layout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, df: pl.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(path)


def _run(params: dict, out: Path, tmp_path: Path, offline: str = "1"):
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE=offline, HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, str(ROOT / "workflow_scripts/build_hub_corpus.py"),
                           "--params", json.dumps(params), "--out", str(out)],
                          capture_output=True, text=True, env=env)


def test_hub_corpus_script_writes_the_offline_schema(tmp_path):
    """Local copies in the hub layouts, named through `local_sources`; Chinese/Persian under the hubs' names."""
    flores, fw2, fw = tmp_path / "flores", tmp_path / "fineweb2", tmp_path / "fineweb"
    for config in ("eng_Latn", "fra_Latn", "cmn_Hans"):
        _write(flores / "devtest" / f"{config}.parquet",
               pl.DataFrame({"id": [1, 2, 3], "text": [f"{config} {i}" for i in range(3)]}))
    for config in ("tel_Telu", "fas_Arab"):
        _write(fw2 / "data" / config / "train" / "000_00000.parquet",
               pl.DataFrame({"id": [f"{config}-{i}" for i in range(5)], "text": [f"doc {i}" for i in range(5)]}))
    _write(fw / "sample" / "10BT" / "000_00000.parquet", pl.DataFrame({"id": ["e0", "e1", "e2"], "text": ["a", "b", "c"]}))
    params = {"english": "eng_Latn", "parallel_languages": ["fra_Latn", "zho_Hans"],
              "mono_languages": ["tel_Telu", "pes_Arab"], "flores_split": "devtest",
              "fineweb2_docs_per_language": 4, "english_web": "fineweb", "english_web_docs": 2,
              "local_sources": {"flores_plus": str(flores), "flores200": None, "fineweb2": str(fw2),
                                "fineweb": str(fw), "dclm": None}}
    out = tmp_path / "out"
    proc = _run(params, out, tmp_path)
    assert proc.returncode == 0, proc.stderr

    par = pl.read_parquet(out / "parallel.parquet")
    assert par.schema == {"sid": pl.Int64, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8}
    assert par.height == 9 and set(par["lang"]) == {"eng_Latn", "fra_Latn", "zho_Hans"}
    assert par.filter(pl.col("lang") == "zho_Hans")["text"].to_list() == ["cmn_Hans 0", "cmn_Hans 1", "cmn_Hans 2"]
    mono = pl.read_parquet(out / "mono.parquet")
    assert set(mono.columns) == {"doc_id", "lang", "text", "source"}
    counts = dict(mono.group_by("lang").len().rows())
    assert counts == {"tel_Telu": 4, "pes_Arab": 4, "eng_Latn": 2}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"] == "hub" and manifest["datasets"]["parallel"] == str(flores)


def test_gated_flores_without_token_is_one_line(tmp_path):
    params = {"english": "eng_Latn", "parallel_languages": ["fra_Latn"], "mono_languages": ["tel_Telu"],
              "fineweb2_docs_per_language": 1, "english_web_docs": 1}
    # online (the hub, not its cache) but no token: the gated FLoRes+ fails with one line
    out = tmp_path / "out"
    proc = _run(params, out, tmp_path, offline="0")
    assert proc.returncode == 1
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "HF_TOKEN" in err and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir()), "nothing half-written"
