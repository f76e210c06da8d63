"""Hub-layout copies built from a corpus in the project schema load back through the hub loaders unchanged."""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402
import pytest  # noqa: E402

from hybridlab.data import hub  # noqa: E402
from hybridlab.data.hub_layout import write_hub_layout  # noqa: E402
from hybridlab.errors import HybridlabError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAR = ["eng_Latn", "fra_Latn", "zho_Hans", "pes_Arab"]


def _corpus():
    """A small corpus in the offline schema: sids 0..4 in every language plus sid 7 missing in Persian."""
    rows = [(sid, lang, f"{lang} sentence {sid}", "pkg") for sid in (0, 1, 2, 3, 4, 7) for lang in PAR
            if not (sid == 7 and lang == "pes_Arab")]
    parallel = pl.DataFrame(rows, schema={"sid": pl.Int64, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8},
                            orient="row")
    docs = [(f"{lang}/{i}", lang, f"{lang} document {i}\nline two", "pkg")
            for lang, n in (("tel_Telu", 5), ("zho_Hans", 3), ("pes_Arab", 4), ("eng_Latn", 6)) for i in range(n)]
    mono = pl.DataFrame(docs, schema={"doc_id": pl.Utf8, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8},
                        orient="row")
    return parallel, mono


def test_layout_round_trips_through_the_hub_loaders(tmp_path):
    parallel, mono = _corpus()
    dirs = write_hub_layout(parallel, mono, tmp_path / "hub", split="devtest", shards=2)
    # each hub's exact paths and config names
    assert (dirs["flores_plus"] / "devtest" / "cmn_Hans.parquet").is_file()
    assert (dirs["flores200"] / "devtest" / "zho_Hans.devtest").is_file()
    assert sorted(p.name for p in (dirs["fineweb2"] / "data" / "fas_Arab" / "train").iterdir()) == [
        "000_00000.parquet", "000_00001.parquet"]
    assert (dirs["fineweb2"] / "data" / "cmn_Hani" / "train").is_dir()
    assert not (dirs["fineweb2"] / "data" / "eng_Latn").exists()
    assert sorted(p.name for p in (dirs["fineweb"] / "sample" / "10BT").iterdir()) == [
        "000_00000.parquet", "001_00000.parquet"]
    assert len(list((dirs["dclm"] / "global-shard_01_of_10" / "local-shard_0_of_10").glob("shard_*_processed.jsonl*"))) == 2
    assert {"id", "text", "iso_639_3", "iso_15924", "glottocode"} <= set(
        pl.read_parquet(dirs["flores_plus"] / "devtest" / "cmn_Hans.parquet").columns)

    # parallel: sentences present in every language, renumbered 1..5 in sid order, from either copy
    expect = {lang: [f"{lang} sentence {s}" for s in (0, 1, 2, 3, 4)] for lang in PAR}
    for df in (hub.load_flores(PAR, "devtest", local=dirs["flores_plus"]),
               hub.load_flores200(PAR, "devtest", local=dirs["flores200"])):
        assert sorted(set(df["sid"])) == [1, 2, 3, 4, 5]
        for lang in PAR:
            assert df.filter(pl.col("lang") == lang).sort("sid")["text"].to_list() == expect[lang]

    # mono: every document back, in corpus order, under its project code and doc id (round-robin shards
    # are read file by file, so the order is shard 0's documents, then shard 1's)
    got = hub.load_fineweb2(["tel_Telu", "zho_Hans", "pes_Arab"], 100, local=dirs["fineweb2"])
    for lang in ("tel_Telu", "zho_Hans", "pes_Arab"):
        want = mono.filter(pl.col("lang") == lang)
        back = got.filter(pl.col("lang") == lang)
        assert sorted(back["doc_id"].to_list()) == sorted(want["doc_id"].to_list())
        assert dict(zip(back["doc_id"], back["text"])) == dict(zip(want["doc_id"], want["text"]))
    english = mono.filter(pl.col("lang") == "eng_Latn")
    fw = hub.load_english_web(100, "fineweb", local=dirs["fineweb"])
    assert dict(zip(fw["doc_id"], fw["text"])) == dict(zip(english["doc_id"], english["text"]))
    dclm = hub.load_english_web(100, "dclm", local=dirs["dclm"])
    assert sorted(dclm["text"].to_list()) == sorted(english["text"].to_list())
    assert fw["doc_id"].to_list()[:3] == ["eng_Latn/0", "eng_Latn/2", "eng_Latn/4"]  # shard 0 first


def test_layout_errors(tmp_path):
    parallel, mono = _corpus()
    both = pl.concat([mono, pl.DataFrame({"doc_id": ["t0"], "lang": ["zho_Hant"], "text": ["繁體"], "source": ["x"]})])
    with pytest.raises(HybridlabError, match="zho_Hans and zho_Hant are both config 'cmn_Hani' of fineweb2"):
        write_hub_layout(parallel, both, tmp_path / "a")
    with pytest.raises(HybridlabError, match="no eng_Latn documents"):
        write_hub_layout(parallel, mono.filter(pl.col("lang") != "eng_Latn"), tmp_path / "b")
    broken = parallel.with_columns(pl.when(pl.col("sid") == 1).then(pl.lit("a\nb")).otherwise("text").alias("text"))
    with pytest.raises(HybridlabError, match="one sentence per line"):
        write_hub_layout(broken, mono, tmp_path / "c")
    with pytest.raises(HybridlabError, match="lacks columns"):
        write_hub_layout(parallel.drop("sid"), mono, tmp_path / "d")


def test_make_hub_layout_script(tmp_path):
    parallel, mono = _corpus()
    parallel.write_parquet(tmp_path / "parallel.parquet")
    mono.write_parquet(tmp_path / "mono.parquet")
    out = tmp_path / "hub"
    proc = subprocess.run([sys.executable, str(ROOT / "workflow_scripts/make_hub_layout.py"), "--params",
                           json.dumps({"split": "dev", "shards": 1}), "--parallel", str(tmp_path / "parallel.parquet"),
                           "--mono", str(tmp_path / "mono.parquet"), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    dirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert dirs["fineweb2"] == str(out / "fineweb-2")
    assert hub.load_flores(["eng_Latn", "zho_Hans"], "dev", local=dirs["flores_plus"]).height == 10


@pytest.mark.parametrize("parallel_key", ["flores_plus", "flores200"])
def test_corpus_step_over_the_layout_gives_back_the_corpus(tmp_path, parallel_key):
    """The hub preset's corpus step, pointed at the built layout through `local_sources`, returns the corpus."""
    parallel, mono = _corpus()
    dirs = write_hub_layout(parallel, mono, tmp_path / "hub", split="devtest")
    keys = {"flores_plus": None, "flores200": None, "fineweb2": str(dirs["fineweb2"]), "fineweb": str(dirs["fineweb"]),
            "dclm": None, parallel_key: str(dirs[parallel_key])}
    params = {"english": "eng_Latn", "parallel_languages": PAR[1:], "mono_languages": ["tel_Telu", "zho_Hans", "pes_Arab"],
              "flores_split": "devtest", "fineweb2_docs_per_language": 100, "english_web": "fineweb",
              "english_web_docs": 100, "local_sources": keys}
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "workflow_scripts/build_hub_corpus.py"), "--params",
                           json.dumps(params), "--out", str(out)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    par = pl.read_parquet(out / "parallel.parquet")
    complete = parallel.filter(pl.col("sid") != 7)
    assert sorted(par.select("lang", "text").rows()) == sorted(complete.select("lang", "text").rows())
    back = pl.read_parquet(out / "mono.parquet")
    assert sorted(back.select("doc_id", "lang", "text").rows()) == sorted(mono.select("doc_id", "lang", "text").rows())
