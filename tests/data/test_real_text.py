"""The real text shipped under data/ (FLORES-200 devtest, NTREX-128) and the loaders that read it."""

import copy
import csv
import hashlib
import lzma
import math
from pathlib import Path

import polars as pl
import pytest

from hybridlab import config as cfgmod
from hybridlab.data import hub
from hybridlab.data.languages import LANGUAGES, dominant_script, get_language, script_fraction
from hybridlab.data.local_sources import check_hub_languages
from hybridlab.errors import HybridlabError
from hybridlab.pipeline.jobs.data import hub_corpus_job

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
FLORES, NTREX = DATA / "flores200", DATA / "ntrex128"
LINES = {"flores200": 1012, "ntrex128": 1997}
NTREX_LACKS = {"ary_Arab", "bam_Latn", "ory_Orya", "asm_Beng", "sot_Latn"}
SHIPPED = {  # English, the 13 SoftCKA languages, Yoruba, Southern Sotho, the 26 distillation languages
    "eng_Latn", "fra_Latn", "zho_Hans", "hin_Deva", "tha_Thai", "pes_Arab", "ben_Beng", "srp_Cyrl", "ary_Arab",
    "arb_Arab", "lit_Latn", "bam_Latn", "ory_Orya", "asm_Beng", "yor_Latn", "sot_Latn", "tel_Telu", "mal_Mlym",
    "tam_Taml", "mya_Mymr", "khm_Khmr", "bod_Tibt", "amh_Ethi", "hye_Armn", "rus_Cyrl", "jpn_Jpan", "kor_Hang",
    "ell_Grek", "heb_Hebr", "kat_Geor", "sin_Sinh", "guj_Gujr", "kan_Knda", "tur_Latn", "swh_Latn",
}


def _sources() -> list[dict]:
    with open(DATA / "SOURCES.tsv", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _text(file: str | Path) -> str:
    return lzma.decompress((ROOT / file).read_bytes()).decode("utf-8")


def _lines(file: str | Path) -> list[str]:
    return _text(file).splitlines()


@pytest.fixture(scope="module")
def sources():
    return _sources()


@pytest.fixture(scope="module")
def flores_sentences(sources):
    return {line.strip() for row in sources if row["dataset"] == "flores200" for line in _lines(row["file"])
            if line.strip()}


def test_sources_cover_the_languages_and_match_the_registry(sources):
    flores = {r["lang"] for r in sources if r["dataset"] == "flores200"}
    ntrex = {r["lang"] for r in sources if r["dataset"] == "ntrex128"}
    assert flores == SHIPPED and ntrex == SHIPPED - NTREX_LACKS
    assert {c for c in SHIPPED if get_language(c).ntrex128_code is None} == NTREX_LACKS
    for r in sources:
        assert r["commit"] == "ac0f19c0be3cb4e0d9450fcb2d7a9847c4bdd180"
        lang = get_language(r["lang"])
        if r["dataset"] == "flores200":
            assert r["file"] == f"data/flores200/devtest/{lang.flores200_code}.devtest.xz"
        else:  # the file the loader resolves from the registry's NTREX name
            assert hub._ntrex128_files(NTREX, lang.ntrex128_code, "test")[1] == [ROOT / r["file"]]
        assert Path(r["path"]).name + ".xz" == Path(r["file"]).name
    shipped = sorted(p.relative_to(ROOT).as_posix() for p in DATA.rglob("*.xz"))
    assert shipped == sorted(r["file"] for r in sources)
    total = sum((ROOT / r["file"]).stat().st_size for r in sources)
    print(f"shipped text: {len(sources)} files, {total} bytes")
    assert total <= 10_000_000


def test_every_file_decompresses_to_the_recorded_original(sources):
    for r in sources:
        packed = (ROOT / r["file"]).read_bytes()
        assert hashlib.sha256(packed).hexdigest() == r["sha256_xz"], r["file"]
        raw = lzma.decompress(packed)
        assert hashlib.sha256(raw).hexdigest() == r["sha256"], r["file"]
        lines = raw.decode("utf-8").split("\n")
        assert lines[-1] == "" and all(x.strip() for x in lines[:-1]), r["file"]  # no empty lines
        assert len(lines) - 1 == LINES[r["dataset"]], r["file"]


def test_each_file_is_written_in_its_languages_script(sources):
    for r in sources:
        text, script = _text(r["file"]), get_language(r["lang"]).script
        # dominant_script names Han text without kana `Hani` (blocks cannot tell Hans from Hant)
        assert dominant_script(text) == {"Hans": "Hani", "Hant": "Hani"}.get(script, script), r["file"]
        assert script_fraction(text, script) > 0.8, r["file"]
    # simplified, not traditional, Chinese: simplified-only characters against their traditional forms
    for r in sources:
        if r["lang"] == "zho_Hans":
            text = _text(r["file"])
            simplified, traditional = (sum(text.count(c) for c in s) for s in ("这们国说时会", "這們國說時會"))
            assert simplified > 100 and traditional == 0, r["file"]


def test_load_flores200_reads_the_shipped_xz_files():
    langs = ["eng_Latn", "zho_Hans", "ory_Orya"]
    df = hub.load_flores200(langs, "devtest", local=FLORES)
    assert df.height == 3 * 1012
    for lang in langs:
        part = df.filter(pl.col("lang") == lang)
        assert part["sid"].to_list() == list(range(1, 1013))
        assert part["text"].to_list() == _lines(f"data/flores200/devtest/{lang}.devtest.xz")
    assert df.row(0) == (1, "eng_Latn", _lines("data/flores200/devtest/eng_Latn.devtest.xz")[0], "flores200/devtest")
    assert df["source"].unique().to_list() == ["flores200/devtest"]


def test_xz_rows_equal_the_text_builders_rows_and_plain_files_win(tmp_path):
    text = "first\n\nthird \r\nfourth\rfifth\n"  # an empty line, CRLF and a lone CR
    plain, packed = tmp_path / "plain" / "dev", tmp_path / "packed" / "dev"
    plain.mkdir(parents=True)
    packed.mkdir(parents=True)
    (plain / "eng_Latn.dev").write_bytes(text.encode())
    (packed / "eng_Latn.dev.xz").write_bytes(lzma.compress(text.encode()))
    rows = [r["text"] for r in hub.iter_rows("flores200", "eng_Latn", "dev", local=tmp_path / "plain")]
    assert rows == ["first", "", "third ", "fourth", "fifth"]
    assert [r["text"] for r in hub.iter_rows("flores200", "eng_Latn", "dev", local=tmp_path / "packed")] == rows
    (packed / "eng_Latn.dev").write_text("plain\n")  # both present: the plain file is read
    assert [r["text"] for r in hub.iter_rows("flores200", "eng_Latn", "dev", local=tmp_path / "packed")] == ["plain"]
    (packed / "fra_Latn.dev.xz").write_bytes(b"not xz")
    with pytest.raises(HybridlabError, match=r"cannot read dev/fra_Latn.dev\[.xz\]") as info:
        list(hub.iter_rows("flores200", "fra_Latn", "dev", local=tmp_path / "packed"))
    assert "\n" not in str(info.value)


def test_load_ntrex128_groups_consecutive_sentences():
    df = hub.load_ntrex128(["eng_Latn", "zho_Hans"], local=NTREX, sentences_per_doc=16)
    for lang, file in (("eng_Latn", "newstest2019-src.eng.txt.xz"), ("zho_Hans", "newstest2019-ref.zho_Hans.txt.xz")):
        lines = _lines(NTREX / file)
        part = df.filter(pl.col("lang") == lang)
        assert part.height == math.ceil(1997 / 16) == 125
        assert part["doc_id"].to_list() == [f"ntrex128:{lang}:{k}" for k in range(125)]
        assert part["text"][0] == "\n".join(lines[:16])
        assert part["text"][-1] == "\n".join(lines[124 * 16:])  # the last 13 sentences
        assert "\n".join(part["text"]).split("\n") == lines  # every sentence once, in file order
    assert df["source"].unique().to_list() == ["ntrex128"]
    assert list(df.schema.items()) == list(hub.MONO_SCHEMA.items())
    assert hub.load_ntrex128(["fra_Latn"], local=NTREX, sentences_per_doc=1000).height == 2


def test_no_flores_sentence_is_in_any_ntrex_file(sources, flores_sentences):
    assert len(flores_sentences) > 30 * 1000
    for r in sources:
        if r["dataset"] == "ntrex128":
            shared = {s.strip() for s in _lines(r["file"])} & flores_sentences
            assert not shared, (r["file"], sorted(shared)[:3])


def test_hub_corpus_job_on_the_shipped_text_keeps_flores_out_of_training(tmp_path):
    params = {"english": "eng_Latn", "parallel_languages": ["zho_Hans", "ory_Orya"],
              "mono_languages": ["fra_Latn", "zho_Hans"], "ntrex_sentences_per_doc": 8,
              "local_sources": {"flores200": str(FLORES), "ntrex128": str(NTREX), "flores_plus": None,
                                "fineweb2": None, "fineweb": None, "dclm": None}}
    manifest = hub_corpus_job(params, tmp_path / "out")
    parallel = pl.read_parquet(tmp_path / "out" / "parallel.parquet")
    mono = pl.read_parquet(tmp_path / "out" / "mono.parquet")
    assert sorted(parallel["lang"].unique()) == ["eng_Latn", "ory_Orya", "zho_Hans"] and parallel.height == 3 * 1012
    assert mono.group_by("lang").len().sort("lang").rows() == [("eng_Latn", 250), ("fra_Latn", 250), ("zho_Hans", 250)]
    assert manifest["datasets"]["mono"] == manifest["datasets"]["english"] == f"ntrex128:{NTREX}"
    assert manifest["datasets"]["parallel"] == str(FLORES)
    mono_sentences = {s.strip() for doc in mono["text"] for s in doc.split("\n")}
    assert len(mono_sentences) > 3 * 1900
    assert not mono_sentences & {s.strip() for s in parallel["text"]}


def test_a_language_ntrex_lacks_is_a_one_line_error(tmp_path):
    with pytest.raises(HybridlabError, match="NTREX-128 has no language bam_Latn") as info:
        hub.load_ntrex128(["eng_Latn", "bam_Latn"], local=NTREX, sentences_per_doc=16)
    assert "\n" not in str(info.value)
    params = {"english": "eng_Latn", "parallel_languages": ["ory_Orya"], "mono_languages": ["ory_Orya"],
              "local_sources": {"flores200": str(FLORES), "ntrex128": str(NTREX)}}
    with pytest.raises(HybridlabError, match="NTREX-128 has no language ory_Orya"):
        hub_corpus_job(params, tmp_path / "out")
    # a registry language whose file a local copy lacks
    with pytest.raises(HybridlabError, match=r"has no newstest2019-ref.fra.txt\[.xz\]") as info:
        hub.load_ntrex128(["fra_Latn"], local=tmp_path, sentences_per_doc=16)
    assert "\n" not in str(info.value)
    with pytest.raises(HybridlabError, match="sentences_per_doc=0 must be >= 1"):
        hub.load_ntrex128(["fra_Latn"], local=NTREX, sentences_per_doc=0)
    both = dict(params, mono_languages=["fra_Latn"])
    both["local_sources"] = dict(params["local_sources"], fineweb2="/data/fineweb-2")
    with pytest.raises(HybridlabError, match="both fineweb2 and ntrex128"):
        hub_corpus_job(both, tmp_path / "out")


def test_ntrex_names_of_registry_languages():
    assert {c: LANGUAGES[c].ntrex128_code for c in ("eng_Latn", "zho_Hans", "zho_Hant", "pes_Arab", "srp_Cyrl",
                                                    "swh_Latn", "khk_Cyrl", "npi_Deva", "yor_Latn")} == {
        "eng_Latn": "eng", "zho_Hans": "zho_Hans", "zho_Hant": "zho_Hant", "pes_Arab": "fas",
        "srp_Cyrl": "srp-Cyrl", "swh_Latn": "swa", "khk_Cyrl": "mon", "npi_Deva": "nep", "yor_Latn": "yor"}
    assert get_language("yor_Latn").gettext_locales == ("yo",) and get_language("sot_Latn").gettext_locales == ("st",)


def test_config_validation_checks_ntrex_languages():
    config = cfgmod.load(ROOT / "config.yaml")

    def with_ntrex(mono, **local):
        c = copy.deepcopy(config)
        c["presets"]["paper"]["data"]["mono_languages"] = mono
        c["presets"]["paper"]["local_sources"] = {"flores200": "data/flores200", "ntrex128": "data/ntrex128", **local}
        return c

    cfgmod.validate(with_ntrex(["fra_Latn", "tel_Telu", "yor_Latn"]))
    with pytest.raises(HybridlabError) as info:
        check_hub_languages(with_ntrex(["tel_Telu", "sot_Latn"]))
    msg = str(info.value)
    assert "presets.paper.data.mono_languages" in msg and "NTREX-128 has no language sot_Latn" in msg
    assert "\n" not in msg
    with pytest.raises(HybridlabError, match="both fineweb2 and ntrex128"):
        check_hub_languages(with_ntrex(["tel_Telu"], fineweb2="/data/fineweb-2"))
