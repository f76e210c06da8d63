"""Hub loaders against local copies in each hub's own layout and config names (no network: offline forced)."""

import json
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets.config  # noqa: E402
import huggingface_hub  # noqa: E402
import huggingface_hub.constants  # noqa: E402
import polars as pl  # noqa: E402
import pytest  # noqa: E402

from hybridlab.data import hub  # noqa: E402
from hybridlab.errors import HybridlabError  # noqa: E402


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    # Modules may have been imported before this file set the env vars, so patch the parsed flags too.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def _flores_rows(config, ids, script):
    iso, _, sc = config.partition("_")
    n = len(ids)
    return pl.DataFrame({
        "id": ids, "iso_639_3": [iso] * n, "iso_15924": [sc] * n, "glottocode": ["xxxx1234"] * n,
        "text": [f"{script} {i}" for i in ids], "url": [f"https://example.org/{i}" for i in ids],
        "domain": ["wikinews"] * n, "topic": ["science"] * n, "has_image": [0] * n, "has_hyperlink": [0] * n,
        "last_updated": ["2.0"] * n,
    })


@pytest.fixture
def flores_dir(tmp_path):
    """FLoRes+ hub layout: {dev,devtest}/<config>.parquet; Chinese under its FLoRes+ name cmn_Hans."""
    root = tmp_path / "flores"
    for config, ids, script in [
        ("eng_Latn", [1, 2, 3, 4], "english"),
        ("fra_Latn", [1, 2, 4], "français"),  # sentence 3 missing: must be dropped everywhere
        ("cmn_Hans", [4, 3, 2, 1], "中文"),  # other row order: sids come from `id`, not position
    ]:
        for split, split_ids in (("dev", ids), ("devtest", [10, 11])):
            (root / split).mkdir(parents=True, exist_ok=True)
            _flores_rows(config, split_ids, script).write_parquet(root / split / f"{config}.parquet")
    return root


def test_load_flores_reads_registry_configs_intersects_sids(flores_dir):
    df = hub.load_flores(["eng_Latn", "fra_Latn", "zho_Hans"], "dev", local=flores_dir)
    assert df.schema == pl.Schema(hub.PARALLEL_SCHEMA)
    assert df["sid"].to_list() == [1, 1, 1, 2, 2, 2, 4, 4, 4]
    assert df["lang"].to_list()[:3] == ["eng_Latn", "fra_Latn", "zho_Hans"]  # project code, not cmn_Hans
    row = df.filter((pl.col("sid") == 4) & (pl.col("lang") == "zho_Hans"))
    assert row["text"].item() == "中文 4"
    assert set(df["source"]) == {"flores_plus/dev"}
    dt = hub.load_flores(["eng_Latn", "fra_Latn"], "devtest", local=flores_dir)
    assert sorted(set(dt["sid"])) == [10, 11]


def test_load_flores_errors(flores_dir, tmp_path, monkeypatch):
    # a language the copy lacks: the message names the file the hub layout expects
    with pytest.raises(HybridlabError, match=r"devtest/tel_Telu.parquet"):
        hub.load_flores(["eng_Latn", "tel_Telu"], "devtest", local=flores_dir)
    with pytest.raises(HybridlabError, match="unknown language code 'zul_Latn'"):
        hub.load_flores(["eng_Latn", "zul_Latn"], "devtest", local=flores_dir)
    # the project code where the dataset has another name is not looked for
    (flores_dir / "dev" / "cmn_Hans.parquet").rename(flores_dir / "dev" / "zho_Hans.parquet")
    with pytest.raises(HybridlabError, match=r"dev/cmn_Hans.parquet"):
        hub.load_flores(["eng_Latn", "zho_Hans"], "dev", local=flores_dir)
    with pytest.raises(HybridlabError, match="'test'"):
        hub.load_flores(["eng_Latn"], "test", local=flores_dir)
    with pytest.raises(HybridlabError, match="not a directory"):
        hub.load_flores(["eng_Latn"], "dev", local=tmp_path / "nowhere")
    # hub name without any token, online: one line before any download is tried
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(HybridlabError, match="HF_TOKEN") as info:
        hub.load_flores(["eng_Latn"], "dev")
    assert "openlanguagedata/flores_plus" in str(info.value) and "\n" not in str(info.value)


def test_offline_without_cache_or_copy_is_one_line():
    with pytest.raises(HybridlabError, match=r"openlanguagedata/flores_plus is not in the Hugging Face cache") as info:
        hub.load_flores(["eng_Latn"], "dev", token="hf_dummy")
    assert "local_sources.flores_plus" in str(info.value) and "\n" not in str(info.value)


def test_offline_reads_the_hf_cache_snapshot(tmp_path):
    """HF_HUB_OFFLINE=1 and no local copy: the dataset's snapshot in the HF cache, in the hub's layout."""
    repo = tmp_path / "hf_home" / "hub" / "datasets--HuggingFaceFW--fineweb-2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shard = repo / "snapshots" / commit / "data" / "fas_Arab" / "train" / "000_00000.parquet"
    shard.parent.mkdir(parents=True)
    pl.DataFrame({"text": ["سلام"], "id": ["p0"]}).write_parquet(shard)
    df = hub.load_fineweb2(["pes_Arab"], 5)
    assert df.rows() == [("p0", "pes_Arab", "سلام", "fineweb2")]


def test_flores200_text_release(tmp_path):
    root = tmp_path / "flores200_dataset"
    for split in ("dev", "devtest"):
        (root / split).mkdir(parents=True)
    (root / "dev" / "eng_Latn.dev").write_text("one\ntwo\nthree\n")
    (root / "dev" / "zho_Hans.dev").write_text("一\n二\n三\n")  # FLORES-200 keeps the project code
    df = hub.load_flores200(["eng_Latn", "zho_Hans"], "dev", local=root)
    assert df.rows() == [(1, "eng_Latn", "one", "flores200/dev"), (1, "zho_Hans", "一", "flores200/dev"),
                         (2, "eng_Latn", "two", "flores200/dev"), (2, "zho_Hans", "二", "flores200/dev"),
                         (3, "eng_Latn", "three", "flores200/dev"), (3, "zho_Hans", "三", "flores200/dev")]
    (root / "dev" / "fra_Latn.dev").write_text("un\ndeux\n")
    with pytest.raises(HybridlabError, match="different line counts"):
        hub.load_flores200(["eng_Latn", "fra_Latn"], "dev", local=root)
    with pytest.raises(HybridlabError, match=r"devtest/eng_Latn.devtest"):
        hub.load_flores200(["eng_Latn"], "devtest", local=root)


@pytest.fixture
def fw2_dir(tmp_path):
    """FineWeb-2 hub layout: data/<config>/train/*.parquet, Persian under fas_Arab, Chinese under cmn_Hani."""
    root = tmp_path / "fw2"

    def shard(config, name, df):
        folder = root / "data" / config / "train"
        folder.mkdir(parents=True, exist_ok=True)
        df.write_parquet(folder / name)

    shard("tel_Telu", "000_00000.parquet", pl.DataFrame({"text": ["a", "", "c"], "id": ["t0", "t1", "t2"]}))
    shard("tel_Telu", "000_00001.parquet", pl.DataFrame({"text": ["d", "  ", "f"], "id": ["t3", "t4", "t5"]}))
    shard("fas_Arab", "000_00000.parquet", pl.DataFrame({"text": ["سلام"], "id": ["p0"]}))
    shard("cmn_Hani", "000_00000.parquet", pl.DataFrame({"text": ["你好", "世界"], "id": ["z0", "z1"]}))
    # a split the loader must not read
    (root / "data" / "tel_Telu" / "test").mkdir()
    pl.DataFrame({"text": ["test doc"], "id": ["x"]}).write_parquet(root / "data" / "tel_Telu" / "test" / "0.parquet")
    return root


def test_fineweb2_configs_from_registry_first_n_nonempty(fw2_dir, caplog):
    df = hub.load_fineweb2(["tel_Telu", "pes_Arab", "zho_Hans"], 3, local=fw2_dir)
    assert df.schema == pl.Schema(hub.MONO_SCHEMA)
    tel = df.filter(pl.col("lang") == "tel_Telu")
    assert tel["doc_id"].to_list() == ["t0", "t2", "t3"] and tel["text"].to_list() == ["a", "c", "d"]
    assert df.filter(pl.col("lang") == "pes_Arab")["doc_id"].to_list() == ["p0"]  # read from fas_Arab
    assert df.filter(pl.col("lang") == "zho_Hans")["text"].to_list() == ["你好", "世界"]  # from cmn_Hani
    assert "stream ended after 1 of 3" in caplog.text
    assert set(df["source"]) == {"fineweb2"}
    with pytest.raises(HybridlabError, match="load_english_web"):
        hub.load_fineweb2(["eng_Latn"], 3, local=fw2_dir)
    with pytest.raises(HybridlabError, match=r"data/khm_Khmr/train/\*.parquet"):
        hub.load_fineweb2(["khm_Khmr"], 3, local=fw2_dir)


def test_english_web_sources(tmp_path):
    fw = tmp_path / "fw"
    (fw / "sample" / "10BT").mkdir(parents=True)
    pl.DataFrame({"text": ["x", "y"], "id": ["<urn:1>", "<urn:2>"]}).write_parquet(fw / "sample/10BT/000_00000.parquet")
    (fw / "data" / "CC-MAIN-2024-10").mkdir(parents=True)
    pl.DataFrame({"text": ["dump"], "id": ["<urn:9>"]}).write_parquet(fw / "data/CC-MAIN-2024-10/000_00000.parquet")
    df = hub.load_english_web(5, "fineweb", local=fw)
    assert df["doc_id"].to_list() == ["<urn:1>", "<urn:2>"] and set(df["lang"]) == {"eng_Latn"}
    assert hub.load_english_web(5, "fineweb", local=fw, config="CC-MAIN-2024-10")["text"].to_list() == ["dump"]

    dclm = tmp_path / "dclm"
    folder = dclm / "global-shard_01_of_10" / "local-shard_0_of_10"
    folder.mkdir(parents=True)
    (folder / "shard_00000000_processed.jsonl").write_text(
        "".join(json.dumps({"text": t, "url": f"u{i}"}) + "\n" for i, t in enumerate(["p", "q", "r"])))
    df = hub.load_english_web(2, "dclm", local=dclm)
    assert df["text"].to_list() == ["p", "q"]
    assert df["doc_id"].to_list() == ["dclm/eng_Latn/0", "dclm/eng_Latn/1"] and df["source"].to_list() == ["dclm"] * 2
    with pytest.raises(HybridlabError, match="pass id_column=None"):
        hub.stream_docs("dclm", None, 2, lang="eng_Latn", source="dclm", local=dclm)
    with pytest.raises(HybridlabError, match="'dolma'"):
        hub.load_english_web(2, "dolma")


def test_dclm_zstd_shards(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    folder = tmp_path / "dclm" / "global-shard_01_of_10" / "local-shard_0_of_10"
    folder.mkdir(parents=True)
    raw = "".join(json.dumps({"text": t}) + "\n" for t in ["α", "β"]).encode()
    (folder / "shard_00000000_processed.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    assert hub.load_english_web(5, "dclm", local=tmp_path / "dclm")["text"].to_list() == ["α", "β"]


def test_write_frames_appends_languages_one_at_a_time_and_reads_back_as_their_concat(tmp_path):
    """The hub corpus writes mono.parquet language by language (one language's documents in memory)."""
    from hybridlab.data.hub import MONO_SCHEMA, write_frames

    frames = [pl.DataFrame({"doc_id": [f"{lang}/{i}" for i in range(n)], "lang": [lang] * n,
                            "text": [f"text {lang} {i}" for i in range(n)], "source": ["x"] * n}, schema=MONO_SCHEMA)
              for lang, n in (("tel_Telu", 3), ("amh_Ethi", 2), ("eng_Latn", 4))]
    seen = []

    def one_at_a_time():
        for df in frames:
            seen.append(df.height)
            yield df

    counts = write_frames(one_at_a_time(), tmp_path / "mono.parquet", MONO_SCHEMA)
    assert counts == {"tel_Telu": 3, "amh_Ethi": 2, "eng_Latn": 4} and seen == [3, 2, 4]
    assert pl.read_parquet(tmp_path / "mono.parquet").equals(pl.concat(frames))
    assert write_frames(iter([]), tmp_path / "empty.parquet", MONO_SCHEMA) == {}
    assert pl.read_parquet(tmp_path / "empty.parquet").schema == MONO_SCHEMA
