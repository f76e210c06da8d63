"""Hub loaders against local parquet copies in the hub schemas (no network: offline mode is forced)."""

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
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def _flores_rows(lang, ids, script):
    iso, _, sc = lang.partition("_")
    return pl.DataFrame(
        {
            "id": ids,
            "iso_639_3": [iso] * len(ids),
            "iso_15924": [sc] * len(ids),
            "glottocode": ["xxxx1234"] * len(ids),
            "text": [f"{script} {i}" for i in ids],
            "url": [f"https://example.org/{i}" for i in ids],
            "domain": ["wikinews"] * len(ids),
            "topic": ["science"] * len(ids),
            "has_image": [0] * len(ids),
            "has_hyperlink": [0] * len(ids),
            "last_updated": ["2.0"] * len(ids),
        }
    )


@pytest.fixture
def flores_dir(tmp_path):
    root = tmp_path / "flores"
    for lang, ids, script in [
        ("eng_Latn", [1, 2, 3, 4], "english"),
        ("fra_Latn", [1, 2, 4], "français"),  # sentence 3 missing: must be dropped everywhere
        ("tel_Telu", [4, 3, 2, 1], "తెలుగు"),  # other row order: sids come from `id`, not position
    ]:
        (root / lang).mkdir(parents=True)
        _flores_rows(lang, ids, script).write_parquet(root / lang / "dev.parquet")
        _flores_rows(lang, [10, 11], script).write_parquet(root / lang / "devtest.parquet")
    return root


def test_load_flores_intersects_sids_and_uses_ids(flores_dir):
    df = hub.load_flores(["eng_Latn", "fra_Latn", "tel_Telu"], "dev", path_or_name=flores_dir)
    assert df.schema == pl.Schema(hub.PARALLEL_SCHEMA)
    assert df["sid"].to_list() == [1, 1, 1, 2, 2, 2, 4, 4, 4]
    assert df["lang"].to_list()[:3] == ["eng_Latn", "fra_Latn", "tel_Telu"]
    row = df.filter((pl.col("sid") == 4) & (pl.col("lang") == "tel_Telu"))
    assert row["text"].item() == "తెలుగు 4"
    assert set(df["source"]) == {"flores_plus/dev"}
    # 'dev' must not pick up 'devtest.parquet'
    dt = hub.load_flores(["eng_Latn", "fra_Latn"], "devtest", path_or_name=flores_dir)
    assert sorted(set(dt["sid"])) == [10, 11]


def test_load_flores_errors(flores_dir, monkeypatch):
    with pytest.raises(HybridlabError, match="zul_Latn"):
        hub.load_flores(["eng_Latn", "zul_Latn"], "dev", path_or_name=flores_dir)
    with pytest.raises(HybridlabError, match="'test'"):
        hub.load_flores(["eng_Latn"], "test", path_or_name=flores_dir)
    # hub name without any token: a clear one-line message before any download is tried
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(HybridlabError, match="HF_TOKEN") as info:
        hub.load_flores(["eng_Latn"], "dev")
    assert "openlanguagedata/flores_plus" in str(info.value) and "\n" not in str(info.value)


def test_hub_failure_is_wrapped_with_dataset_and_config():
    # offline mode: the hub path fails inside `datasets`; the message names dataset, config and the fixes
    with pytest.raises(HybridlabError, match=r"openlanguagedata/flores_plus config 'eng_Latn'.*HF_TOKEN") as info:
        hub.load_flores(["eng_Latn"], "dev", token="hf_dummy")
    assert "huggingface-cli login" in str(info.value) and "\n" not in str(info.value)


@pytest.fixture
def web_dir(tmp_path):
    root = tmp_path / "fw2"
    (root / "tel_Telu").mkdir(parents=True)
    pl.DataFrame({"text": ["a", "", "c"], "id": ["t0", "t1", "t2"], "language": ["tel"] * 3}).write_parquet(
        root / "tel_Telu" / "train-00000.parquet"
    )
    pl.DataFrame({"text": ["d", "  ", "f"], "id": ["t3", "t4", "t5"], "language": ["tel"] * 3}).write_parquet(
        root / "tel_Telu" / "train-00001.parquet"
    )
    (root / "hin_Deva").mkdir()
    pl.DataFrame({"text": ["नमस्ते"], "id": ["h0"]}).write_parquet(root / "hin_Deva" / "train.parquet")
    return root


def test_fineweb2_first_n_nonempty_docs_across_shards(web_dir, caplog):
    df = hub.load_fineweb2(["tel_Telu", "hin_Deva"], 3, path_or_name=web_dir)
    assert df.schema == pl.Schema(hub.MONO_SCHEMA)
    tel = df.filter(pl.col("lang") == "tel_Telu")
    assert tel["doc_id"].to_list() == ["t0", "t2", "t3"] and tel["text"].to_list() == ["a", "c", "d"]
    assert df.filter(pl.col("lang") == "hin_Deva")["doc_id"].to_list() == ["h0"]
    assert "stream ended after 1 of 3" in caplog.text
    assert set(df["source"]) == {"fineweb2"}
    with pytest.raises(HybridlabError, match="load_english_web"):
        hub.load_fineweb2(["eng_Latn"], 3, path_or_name=web_dir)


def test_english_web_sources(tmp_path):
    fw = tmp_path / "fw"
    (fw / "sample-10BT").mkdir(parents=True)
    pl.DataFrame({"text": ["x", "y"], "id": ["<urn:1>", "<urn:2>"]}).write_parquet(fw / "sample-10BT" / "train.parquet")
    df = hub.load_english_web(5, "fineweb", path_or_name=fw)
    assert df["doc_id"].to_list() == ["<urn:1>", "<urn:2>"] and set(df["lang"]) == {"eng_Latn"}

    dclm = tmp_path / "dclm"
    (dclm / "default").mkdir(parents=True)
    pl.DataFrame({"text": ["p", "q", "r"], "url": ["u1", "u2", "u3"]}).write_parquet(dclm / "default" / "train.parquet")
    df = hub.load_english_web(2, "dclm", path_or_name=dclm)
    assert df["doc_id"].to_list() == ["dclm/eng_Latn/0", "dclm/eng_Latn/1"] and df["source"].to_list() == ["dclm"] * 2
    with pytest.raises(HybridlabError, match="pass id_column=None"):
        hub.stream_docs(dclm, None, 2, lang="eng_Latn", source="dclm")
    with pytest.raises(HybridlabError, match="'dolma'"):
        hub.load_english_web(2, "dolma")


def test_missing_local_config(web_dir):
    with pytest.raises(HybridlabError, match=r"no bam_Latn/train.parquet"):
        hub.stream_docs(web_dir, "bam_Latn", 2, lang="bam_Latn", source="fineweb2")
