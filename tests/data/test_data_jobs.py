"""The data and figures rules' library jobs (pack_mixture_job, hub_corpus_job, the offline corpus config and
report, read_tables / render_outputs) called directly on tiny local data, without Snakemake or a subprocess."""

import json

import numpy as np
import polars as pl
import pytest

from hybridlab.errors import HybridlabError

ENG, FRA, TEL = "eng_Latn", "fra_Latn", "tel_Telu"
WORDS = "the cat sat on a mat while rain fell over old hills and dogs ran home".split()


def _texts(n, seed=0, words=60):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, words)) for _ in range(n)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    from hybridlab.data.tokenizer import train_bpe

    d = tmp_path_factory.mktemp("tok")
    train_bpe(_texts(200), vocab_size=300, min_frequency=2, out_path=d)
    return d


# ------------------------------------------------------------------------------------------ pack_mixture_job

def _mono():
    eng, fra = _texts(30, seed=1), _texts(30, seed=2)
    return pl.DataFrame({"doc_id": [f"e{i}" for i in range(30)] + [f"f{i}" for i in range(30)],
                         "lang": [ENG] * 30 + [FRA] * 30, "text": eng + fra, "source": ["toy"] * 60})


def test_pack_mixture_job_reports_and_drops_languages_without_text(bpe, tmp_path):
    from hybridlab.data.packing import PackedDataset, read_stats
    from hybridlab.pipeline.jobs.data import pack_mixture_job

    mono = tmp_path / "mono.parquet"
    _mono().write_parquet(mono)
    said = []
    params = {"english": ENG, "languages": [ENG, FRA, TEL], "english_share": 0.5, "seq_len": 32,
              "total_tokens": 3000, "val_fraction": 0.2, "seed": 0}
    stats = pack_mixture_job(params, mono=mono, tokenizer=bpe, out=tmp_path / "mix", log=said.append)
    assert said[0].startswith("warning: no monolingual text for ['tel_Telu']")
    assert stats == read_stats(tmp_path / "mix")
    for f in ("tokens.npy", "doc_starts.npy", "doc_offsets.npy", "meta.parquet", "stats.json"):
        assert (tmp_path / "mix" / f).is_file()
    meta = pl.read_parquet(tmp_path / "mix" / "meta.parquet")
    assert set(meta["lang"]) == {ENG, FRA}  # English is always in, Telugu has no text
    assert set(PackedDataset(tmp_path / "mix", "train").langs) == {ENG, FRA}
    tokens = np.load(tmp_path / "mix" / "tokens.npy")
    assert tokens.shape == (meta.height, 32)


def test_pack_mixture_job_without_other_languages_is_english_only(bpe, tmp_path):
    from hybridlab.pipeline.jobs.data import pack_mixture_job

    mono = tmp_path / "mono.parquet"
    _mono().write_parquet(mono)
    params = {"english": ENG, "languages": [TEL], "english_share": 0.3, "seq_len": 32, "total_tokens": 2000,
              "val_fraction": 0.2, "seed": 0, "block_rows": 2}
    pack_mixture_job(params, mono=mono, tokenizer=bpe, out=tmp_path / "mix", log=lambda _m: None)
    meta = pl.read_parquet(tmp_path / "mix" / "meta.parquet")
    assert set(meta["lang"]) == {ENG} and meta.height % 2 == 0  # whole blocks of 2 rows


def test_pack_mixture_job_streams_the_english_web_source_to_the_budget(bpe, tmp_path):
    from hybridlab.train.bld_nl import bld_nl_need_tokens
    from hybridlab.pipeline.jobs.data import pack_mixture_job
    from hybridlab.data.tokenizer import load_tokenizer

    shard = tmp_path / "dclm" / "global-shard_01_of_10" / "local-shard_0_of_10"  # DCLM's own layout
    shard.mkdir(parents=True)
    pl.DataFrame({"text": _texts(300, seed=3)}).write_ndjson(shard / "shard_00000000_processed.jsonl")
    shape = {"hidden_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
             "head_dim": 8, "intermediate_size": 32}
    run = {"context_len": 64, "tokens_per_param": 0.5, "micro_batch_size": 2, "lr": 1e-3, "epochs": 2, "eval_every": 4}
    exp = {"mixers": ["gdn"], "pattern": ["full_attention", "mixer", "mixer", "mixer"], "freeze_fraction": 0.5,
           "optimizer_after_unfreeze": "adamw", "freeze_scope": "block"}
    # the rule passes the corpus mixture's keys too (the stream does not read them)
    params = {"english": ENG, "languages": [], "english_share": 1.0, "total_tokens": 1000, "seq_len": 32,
              "val_fraction": 0.05, "seed": 0,
              "stream": {"source": "dclm", "path": str(tmp_path / "dclm")},
              "bld_nl": {"sizes": {"xs": shape}, "run": run, "experiment": exp}}
    said = []
    stats = pack_mixture_job(params, mono=None, tokenizer=bpe, out=tmp_path / "mix", log=said.append)
    need = bld_nl_need_tokens({"xs": shape}, run, exp, vocab_size=len(load_tokenizer(str(bpe))))
    per_epoch = -(-need["gdn-xs"] // 2)  # two epochs over the packed data
    assert said[0].startswith(f"BLD-NL budgets (tokens): {need}; packing {per_epoch} train tokens (2 epoch(s)")
    assert per_epoch <= stats["train_tokens"] < per_epoch + 32
    assert json.loads((tmp_path / "mix" / "stats.json").read_text()) == stats


# ------------------------------------------------------------------------------------------- hub_corpus_job

def _write(path, df):
    path.parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(path)


def _hub_copies(tmp_path):
    flores, fw2, fw = tmp_path / "flores", tmp_path / "fineweb2", tmp_path / "fineweb"
    for config in (ENG, FRA):
        _write(flores / "devtest" / f"{config}.parquet",
               pl.DataFrame({"id": [1, 2, 3], "text": [f"{config} {i}" for i in range(3)]}))
    _write(fw2 / "data" / TEL / "train" / "000_00000.parquet",
           pl.DataFrame({"id": [f"t{i}" for i in range(5)], "text": [f"doc {i}" for i in range(5)]}))
    _write(fw / "sample" / "10BT" / "000_00000.parquet", pl.DataFrame({"id": ["e0", "e1", "e2"], "text": ["a", "b", "c"]}))
    return {"flores_plus": str(flores), "flores200": None, "fineweb2": str(fw2), "fineweb": str(fw), "dclm": None}


def test_hub_corpus_job_writes_the_three_files_and_returns_the_manifest(tmp_path, monkeypatch):
    from hybridlab.pipeline.jobs.data import hub_corpus_job

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    local = _hub_copies(tmp_path)
    params = {"english": ENG, "parallel_languages": [FRA, ENG], "mono_languages": [TEL, ENG],
              "fineweb2_docs_per_language": 4, "english_web_docs": 2, "local_sources": local}
    manifest = hub_corpus_job(params, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.json", "mono.parquet", "parallel.parquet"]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == json.loads(json.dumps(manifest))
    assert [tuple(r) for r in manifest["parallel"]] == [(ENG, 3), (FRA, 3)]
    assert [tuple(r) for r in manifest["mono_docs"]] == [(ENG, 2), (TEL, 4)]  # English only from the web source
    assert manifest["datasets"] == {"parallel": local["flores_plus"], "mono": local["fineweb2"],
                                    "english": local["fineweb"]}
    assert manifest["config"] == params and manifest["source"] == "hub" and manifest["unavailable"] == {}
    par = pl.read_parquet(tmp_path / "out" / "parallel.parquet")
    assert par.filter(pl.col("lang") == FRA)["text"].to_list() == [f"{FRA} {i}" for i in range(3)]


@pytest.mark.parametrize("local, match", [
    ({"flores": "x"}, r"unknown dataset keys \['flores'\]"),
    ({"flores_plus": "a", "flores200": "b"}, "sets both flores_plus and flores200"),
])
def test_hub_corpus_job_local_source_errors(tmp_path, local, match):
    from hybridlab.pipeline.jobs.data import hub_corpus_job

    params = {"english": ENG, "parallel_languages": [FRA], "mono_languages": [TEL],
              "fineweb2_docs_per_language": 1, "english_web_docs": 1, "local_sources": local}
    with pytest.raises(HybridlabError, match=match):
        hub_corpus_job(params, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------- offline corpus

def test_offline_load_config_from_a_file_or_inline(tmp_path):
    from hybridlab.data.offline import OfflineCorpusConfig, load_config

    d = {"parallel_languages": [FRA], "mono_languages": [TEL], "packages": ["coreutils"], "seed": 4}
    f = tmp_path / "cfg.json"
    f.write_text(json.dumps(d))
    assert load_config(f) == load_config(params=json.dumps(d)) == OfflineCorpusConfig.from_dict(d)
    assert load_config(f).seed == 4
    with pytest.raises(HybridlabError, match=r"cannot read --config-json .*missing.json"):
        load_config(tmp_path / "missing.json")
    with pytest.raises(HybridlabError, match=r"--params is not valid JSON \(.* at line 1\); fix the JSON object"):
        load_config(params="{oops")
    with pytest.raises(HybridlabError, match="must hold a JSON object"):
        load_config(params="[1]")
    with pytest.raises(HybridlabError, match="unknown offline corpus option"):
        load_config(params=json.dumps({**d, "colour": 1}))


def test_offline_corpus_report_lines():
    from hybridlab.data.offline import corpus_report

    manifest = {"parallel": {"languages": [ENG, FRA], "n_sentences": 7},
                "mono": {"languages": [ENG, TEL], "per_language": {ENG: {"chars": 10}, TEL: {"chars": 5}}},
                "unavailable": {"parallel": {"xho_Latn": "no catalogue"}, "mono": {}}}
    assert corpus_report(manifest, 1.25, "out/dir") == [
        "offline corpus in 1.2s: parallel 2 languages x 7 sentences; mono 2 languages, 15 chars -> out/dir",
        "  unavailable (parallel) xho_Latn: no catalogue"]


# --------------------------------------------------------------------------------------------- figures

def _perplexity_table():
    rows = []
    for placement, ce in (("standard_periodic", 2.0), ("sandwich", 1.5)):
        for lang in (ENG, "all"):
            rows.append({"model": f"t/{placement}-gdn", "teacher": "t", "placement": placement, "mixer": "gdn",
                         "seed": 0, "lang": lang, "n_tokens": 10, "ce": ce, "ppl": float(np.exp(ce)), "kl": ce / 4})
    rows.append({"model": "t", "teacher": "t", "placement": None, "mixer": None, "seed": None, "lang": "all",
                 "n_tokens": 10, "ce": 1.0, "ppl": float(np.exp(1.0)), "kl": None})
    return pl.DataFrame(rows)


def test_read_tables_plain_and_per_run_items(tmp_path):
    from hybridlab.plots.registry import read_tables

    _perplexity_table().write_parquet(tmp_path / "p.parquet")
    for run in ("a", "b"):
        pl.DataFrame({"step": [0, 1], "loss": [2.0, 1.0]}).write_parquet(tmp_path / f"{run}.parquet")
    tables = read_tables([f"perplexity={tmp_path / 'p.parquet'}", f"bld_sr/seed0/a={tmp_path / 'a.parquet'}",
                          f"bld_sr/seed1/b={tmp_path / 'b.parquet'}"])
    assert sorted(tables) == ["bld_sr", "perplexity"] and tables["perplexity"].height == 5
    assert tables["bld_sr"].height == 4 and "run" in tables["bld_sr"].columns
    with pytest.raises(HybridlabError, match="is not NAME=PATH"):
        read_tables(["perplexity"])
    with pytest.raises(HybridlabError, match="does not exist; build its rule first"):
        read_tables([f"perplexity={tmp_path / 'nope.parquet'}"])
    with pytest.raises(HybridlabError, match="given twice"):
        read_tables([f"perplexity={tmp_path / 'p.parquet'}"] * 2)
    with pytest.raises(HybridlabError, match="take per-run files"):
        read_tables([f"softcka/x={tmp_path / 'a.parquet'}"])


def test_render_outputs_writes_a_table_or_a_figure(tmp_path):
    from hybridlab.plots.registry import render_outputs, render_table

    tables = {"perplexity": _perplexity_table()}
    params = {"baseline_placement": "standard_periodic", "config_hash": "x"}
    line = render_outputs("table_perplexity", tables, params, out_csv=tmp_path / "t.csv", out_md=tmp_path / "t.md")
    expected = render_table("table_perplexity", tables, baseline="standard_periodic")
    assert line == f"table_perplexity: {expected.height} rows -> {tmp_path / 't.csv'}, {tmp_path / 't.md'}"
    assert pl.read_csv(tmp_path / "t.csv").height == expected.height
    assert (tmp_path / "t.md").read_text().startswith("|")
    with pytest.raises(HybridlabError, match="needs --out-csv and --out-md"):
        render_outputs("table_perplexity", tables, params, out_csv=tmp_path / "t.csv")
    with pytest.raises(HybridlabError, match="needs --out-png and --out-pdf"):
        render_outputs("fig_niah", tables, {}, out_png=tmp_path / "f.png")
    with pytest.raises(HybridlabError, match="unknown figure"):
        render_outputs("fig_nope", tables, {}, out_png=tmp_path / "f.png", out_pdf=tmp_path / "f.pdf")
