"""The data phase's jobs: one function per rule, called by its thin workflow script (load, check, build,
publish). The builders and loaders they call live in `hybridlab.data`; the mixture job sits here because a
streamed English mixture is sized by the BLD-NL token budget (`hybridlab.train.bld_nl.bld_nl_need_tokens`),
which needs the models and the training length.

Every job takes its typed section (`hybridlab.config_spec.job_sections`, or its dict, built and checked here) and
plain paths, and replaces its outputs atomically (`hybridlab.atomic`): a failed job leaves no half-written file.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from hybridlab.atomic import atomic_dir, atomic_file, write_text
from hybridlab.config_spec import (HubCorpusJob, HubLayoutJob, MixtureJob, SpacedRetrievalJob, TokenizerJob,
                                   job_settings, to_dict)
from hybridlab.data.languages import dataset_config
from hybridlab.errors import HybridlabError


def offline_corpus_job(config_json: str | Path | None, params: str | None, cache: str | Path, out: str | Path, *,
                       apt_update: bool = False) -> list[str]:
    """The offline presets' corpus (`hybridlab.data.offline.build_offline_corpus`) into `out`, with its own
    config (`OfflineCorpusConfig`) from the JSON file `config_json` or the JSON text `params`; `apt_update` first
    fetches the private apt package lists into `cache`/apt. Returns the report lines (`corpus_report`)."""
    import time

    from hybridlab.data.offline import build_offline_corpus, corpus_report, load_config
    from hybridlab.data.offline_debs import apt_update_private

    config = load_config(config_json, params)
    if apt_update:
        apt_update_private(Path(cache))
    start = time.perf_counter()
    manifest = build_offline_corpus(config, Path(cache), Path(out))
    return corpus_report(manifest, time.perf_counter() - start, Path(out))


def hub_corpus_job(params: HubCorpusJob | dict, out_dir: str | Path, *, token: str | None = None) -> dict:
    """Parallel text from FLoRes+ (or the FLORES-200 release) and monolingual text from FineWeb-2 + FineWeb
    or DCLM (or NTREX-128), written as the offline builder's files (parallel.parquet, mono.parquet,
    manifest.json) in `out_dir`, each replaced atomically; returns the manifest.

    `params`: the job's section (`hybridlab.config_spec.HubCorpusJob`, or its dict). Its `local_sources` name a
    local copy in the hub's own layout per dataset, or null (`hybridlab.data.local_sources`; null reads the
    hub, or its snapshot in the HF cache when HF_HUB_OFFLINE=1). `flores200` set: the parallel text is the
    FLORES-200 text release. `ntrex128` set: the monolingual text is NTREX-128 for mono_languages plus
    English, grouped by `ntrex_sentences_per_doc` sentences per document (the FineWeb-2 / web counts are
    then unused). English comes first among the parallel languages; it is never a FineWeb-2 language.
    mono.parquet is written one language at a time (`hub.write_frames`), so memory holds one language's documents.
    `token`: the hub token.
    """
    from hybridlab.data import hub

    job = job_settings(HubCorpusJob, params, "build_hub_corpus.py")
    local = job.local_sources
    unknown = sorted(set(local) - set(hub.LAYOUTS))
    if unknown:
        raise HybridlabError(f"local_sources: unknown dataset keys {unknown}; known: {', '.join(hub.LAYOUTS)}")
    english = job.english
    split = job.flores_split
    par_langs = [english] + [x for x in job.parallel_languages if x != english]
    if local.get("flores200"):
        if local.get("flores_plus"):
            raise HybridlabError("local_sources sets both flores_plus and flores200; keep the one parallel source")
        parallel = hub.load_flores200(par_langs, split, local=local["flores200"])
        par_source = str(local["flores200"])
    else:
        parallel = hub.load_flores(par_langs, split, local=local.get("flores_plus"), token=token)
        par_source = str(local.get("flores_plus") or hub.FLORES)
    mono_langs = [x for x in job.mono_languages if x != english]
    if local.get("ntrex128"):
        if local.get("fineweb2"):
            raise HybridlabError("local_sources sets both fineweb2 and ntrex128; keep the one monolingual source")
        frames = iter([hub.load_ntrex128(mono_langs + [english], local=local["ntrex128"],
                                     sentences_per_doc=job.ntrex_sentences_per_doc)])
        mono_sources = {"mono": f"ntrex128:{local['ntrex128']}", "english": f"ntrex128:{local['ntrex128']}"}
    else:
        web = job.english_web
        if not (job.fineweb2_docs_per_language and job.english_web_docs):
            raise HybridlabError("build_hub_corpus.py --params: fineweb2_docs_per_language and english_web_docs are "
                                 "needed without local_sources.ntrex128; set data.fineweb2_docs_per_language and "
                                 "data.english_web_docs")
        # one language at a time: streamed, appended to mono.parquet, dropped
        n_docs = job.fineweb2_docs_per_language
        frames = itertools.chain(
            (hub.stream_docs("fineweb2", dataset_config(lang, "fineweb2"), n_docs, lang=lang, source="fineweb2",
                         local=local.get("fineweb2"), token=token) for lang in mono_langs),
            (hub.load_english_web(job.english_web_docs, source=web, local=local.get(web), token=token)
             for _ in range(1)))
        mono_sources = {"mono": str(local.get("fineweb2") or hub.FINEWEB2),
                        "english": str(local.get(web) or hub.HUB_NAMES[web])}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / "mono.parquet") as tmp:
        mono_docs = hub.write_frames(frames, tmp, hub.MONO_SCHEMA)
    manifest = {
        "source": "hub",
        "datasets": {"parallel": par_source, **mono_sources},
        "parallel": parallel.group_by("lang").len().sort("lang").rows(),
        "mono_docs": sorted(mono_docs.items()),
        "unavailable": {},
        "config": params if isinstance(params, dict) else to_dict(job),  # as the rule gave it
    }
    with atomic_file(out / "parallel.parquet") as tmp:
        parallel.write_parquet(tmp)
    write_text(out / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def tokenizer_job(params: TokenizerJob | dict, *, mono: str | Path, out: str | Path) -> int:
    """The project tokenizer into `out`: the hub tokenizer `hub_tokenizer` saved as is, else a byte-level BPE
    of `vocab_size` trained on the monolingual corpus `mono`, sorted by (lang, doc_id) so the same corpus always
    gives the same merges. Returns the vocabulary size."""
    import polars as pl

    from hybridlab.data.tokenizer import load_tokenizer, train_bpe

    job = job_settings(TokenizerJob, params, "train_tokenizer.py")
    if not job.hub_tokenizer and job.vocab_size is None:
        raise HybridlabError("train_tokenizer.py --params: vocab_size is null and no hub_tokenizer; "
                             "set data.tokenizer_vocab_size")
    with atomic_dir(Path(out)) as tmp:
        if job.hub_tokenizer:
            tok = load_tokenizer(job.hub_tokenizer)
            tok.save_pretrained(str(tmp))
        else:
            texts = pl.read_parquet(mono, columns=["lang", "doc_id", "text"]).sort(["lang", "doc_id"])["text"]
            tok = train_bpe(iter(texts.to_list()), vocab_size=job.vocab_size, min_frequency=2, out_path=tmp)
    return len(tok)


def spaced_retrieval_job(params: SpacedRetrievalJob | dict, *, out: str | Path, log=print) -> None:
    """The Spaced Retrieval splits (`hybridlab.data.spaced_retrieval`) as `out`/<split>.parquet; logs each split's
    size and gaps and the share of test examples also in train."""
    from hybridlab.data import spaced_retrieval as sr

    job = job_settings(SpacedRetrievalJob, params, "make_spaced_retrieval.py")
    cfg = sr.SpacedRetrievalConfig(t=job.t, gaps=tuple(job.gaps), gap_weights=tuple(job.gap_weights),
                                   n_train=job.n_train, n_val=job.n_val, n_test=job.n_test, seed=job.seed)
    splits = {s: sr.generate_split(cfg, s) for s in sr.SPLITS}
    for split, records in splits.items():
        sr.write_split(Path(out) / f"{split}.parquet", records, split=split, seed=cfg.seed)
        log(f"{split}: {len(records)} examples, gaps {sorted(set(records.gaps_N.tolist()))}")
    log(f"test examples also in train: {sr.collision_rate(splits['train'], splits['test']):.4f}")


def hub_layout_job(params: HubLayoutJob | dict, *, parallel: str | Path, mono: str | Path, out: str | Path) -> dict:
    """The corpus rewritten in the hub datasets' own layouts (`hybridlab.data.hub_layout.write_hub_layout`) into
    `out`, replaced whole; returns each dataset's directory."""
    import polars as pl

    from hybridlab.data.hub_layout import write_hub_layout

    job = job_settings(HubLayoutJob, params, "make_hub_layout.py")
    out = Path(out)
    with atomic_dir(out) as tmp:
        dirs = write_hub_layout(pl.read_parquet(parallel), pl.read_parquet(mono), tmp, split=job.split,
                                shards=job.shards)
    return {k: str(out / v.name) for k, v in dirs.items()}


def pack_mixture_job(params: MixtureJob | dict, *, mono: str | Path | None, tokenizer: str | Path, out: str | Path,
                     log=print, parallel: str | Path | None = None) -> dict:
    """Tokenise and pack one training mixture into `out` (the mixture rule); returns its stats.

    Corpus mixtures: the monolingual corpus `mono` (parquet) packed by `pack_mixture`. English is always in;
    languages the corpus has no text for are reported through `log` and left out (none left: English
    only). With `heldout` the val rows are those sentences of the `parallel` corpus
    (`packing.with_parallel_heldout`). With `stream` (hub presets, the English mixture) the web source is
    streamed instead (`pack_stream_to_disk`) until the largest BLD-NL arm's token budget is packed (`bld_nl`,
    counted by `hybridlab.train.bld_nl.bld_nl_need_tokens` with this tokenizer's vocabulary, divided by
    run.epochs). The hub token comes from HF_TOKEN.
    """
    import polars as pl

    from hybridlab.data.packed_files import write_packed
    from hybridlab.data.packing import pack_mixture
    from hybridlab.data.tokenizer import load_tokenizer

    job = job_settings(MixtureJob, params, "pack_mixture.py")
    if job.stream:
        return _pack_english_stream(job, load_tokenizer(str(tokenizer)), out, log)
    english = job.english
    # read lazily: pack_mixture loads one language's documents at a time and spills its rows to `out`
    corpus = pl.scan_parquet(mono)
    available = set(corpus.select("lang").unique().collect()["lang"].to_list())
    wanted = [lang for lang in job.languages if lang != english]
    missing = [lang for lang in wanted if lang not in available]
    if missing:  # reported, not silently dropped
        log(f"warning: no monolingual text for {missing}; the mixture uses the other languages "
            f"(see the corpus manifest)")
    languages = [lang for lang in wanted if lang in available]
    tok = load_tokenizer(str(tokenizer))
    heldout = job.heldout
    mixture = pack_mixture(corpus, tok, languages=languages, english_share=job.english_share if languages else 1.0,
                           seq_len=job.seq_len, total_tokens=job.total_tokens,
                           val_fraction=0.0 if heldout else job.val_fraction, seed=job.seed,
                           block_rows=job.block_rows, spill_dir=out)
    if heldout:  # held-out rows from the parallel corpus (never trained on) instead of mixture documents
        from hybridlab.data.packing import with_parallel_heldout

        if parallel is None:
            raise HybridlabError("pack_mixture: params.heldout needs the parallel corpus; pass --parallel")
        langs = [english] + [x for x in heldout.languages if x != english]
        mixture = with_parallel_heldout(mixture, pl.read_parquet(parallel), tok, languages=langs,
                                        n_sentences=heldout.sentences)
    write_packed(out, mixture)
    log(json.dumps(mixture.stats, indent=1)[:4000])
    return mixture.stats


def _pack_english_stream(job: MixtureJob, tok, out, log) -> dict:
    """BLD-NL's English mixture at hub presets: stream the web source until the largest arm's budget is packed."""
    from hybridlab.data import hub
    from hybridlab.data.streamed_packing import pack_stream_to_disk
    from hybridlab.train.bld_nl import bld_nl_need_tokens

    stream, bld = job.stream, to_dict(job.bld_nl)
    if not bld:
        raise HybridlabError("pack_mixture.py --params: stream needs bld_nl (the budget the streamed tokens are sized by)")
    need = bld_nl_need_tokens(bld["sizes"], bld["run"], bld["experiment"], vocab_size=len(tok))
    epochs = bld["run"].get("epochs") or 1
    train_tokens = -(-max(need.values()) // epochs)
    log(f"BLD-NL budgets (tokens): {need}; packing {train_tokens} train tokens ({epochs} epoch(s) of the largest)")
    config = {"dclm": None, "fineweb": hub.FINEWEB_CONFIG}[stream.source]
    # `path`: a local copy in the hub's layout (config local_sources), else the HF cache or the hub
    rows = hub.iter_rows(stream.source, config, "train", local=stream.path, token=os.environ.get("HF_TOKEN"))
    stats = pack_stream_to_disk((r.get("text") for r in rows), tok, out, lang=job.english, seq_len=job.seq_len,
                                train_tokens=train_tokens, val_fraction=job.val_fraction, seed=job.seed,
                                block_rows=job.block_rows)
    log(json.dumps(stats, indent=1)[:4000])
    return stats
