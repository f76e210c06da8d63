# Data phase: parallel + monolingual corpus (offline packages or the hub), tokenizer, packed training
# mixtures, Spaced Retrieval splits. Every output has the same schema whatever the source.

CORPUS = {
    "parallel": R("data", "corpus/parallel.parquet"),
    "mono": R("data", "corpus/mono.parquet"),
    "manifest": R("data", "corpus/manifest.json"),
}
TOKENIZER = R("data", "tokenizer/tokenizer.json")
MIXTURE_FILES = ["tokens.npy", "meta.parquet", "stats.json"]
SR_SPLITS = ["train", "val", "test"]


def corpus_params():
    """Parameters of the corpus step: OfflineCorpusConfig fields offline, loader options for the hub."""
    if OFFLINE:
        keys = ["parallel_languages", "mono_languages", "max_parallel_sentences", "min_parallel_sentences",
                "max_mono_docs_per_language", "sentences_per_doc", "english_bible_docs"]
        p = {k: DATA[k] for k in keys if k in DATA}
        p.update(seed=C["seed"], packages=C["offline"]["packages"],
                 min_english_words=C["offline"]["min_english_words"])
    else:
        keys = ["parallel_languages", "mono_languages", "flores_split", "fineweb2_docs_per_language",
                "english_web", "english_web_docs"]
        p = {k: DATA[k] for k in keys if k in DATA}
        p.update(english=C["languages"]["english"])
    return as_json(p)


rule corpus:
    """Parallel (FLoRes-like, N-way) and monolingual text per language, plus a manifest of sources."""
    output:
        **CORPUS,
    params:
        cfg=corpus_params(),
        script="build_offline_corpus.py" if OFFLINE else "build_hub_corpus.py",
        outdir=R("data", "corpus"),
    log:
        LOG("data", "corpus"),
    benchmark:
        BENCH("data", "corpus")
    resources:
        mem_mb=4000,
        runtime=30 if OFFLINE else 600,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{PY} workflow_scripts/{params.script} --params {params.cfg:q} --cache {CACHE_DIR}/offline "
        "--out {params.outdir} > {log} 2>&1"


rule tokenizer:
    """Byte-level BPE trained on the corpus (smoke/tiny) or the hub tokenizer saved locally (paper)."""
    input:
        mono=CORPUS["mono"],
    output:
        TOKENIZER,
    params:
        outdir=R("data", "tokenizer"),
        cfg=as_json({"vocab_size": DATA.get("tokenizer_vocab_size"), "hub_tokenizer": DATA.get("hub_tokenizer"),
                     "seed": C["seed"]}),
    log:
        LOG("data", "tokenizer"),
    benchmark:
        BENCH("data", "tokenizer")
    resources:
        mem_mb=4000,
        runtime=30,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{PY} workflow_scripts/train_tokenizer.py --params {params.cfg:q} --mono {input.mono} "
        "--out {params.outdir} > {log} 2>&1"


def mixture_params(name):
    if name == "multilingual":
        langs, share = DATA["mono_languages"], DATA["english_share"]
    else:  # English-only text for BLD natural-language pre-training (DCLM at paper scale)
        langs, share = [], 1.0
    return as_json({"languages": langs, "english": C["languages"]["english"], "english_share": share,
                    "seq_len": DATA["seq_len"], "total_tokens": DATA["mixture_tokens"],
                    "val_fraction": DATA["val_fraction"], "seed": C["seed"]})


rule mixture:
    """Tokenised, packed fixed-length sequences (one language per sequence), train/val by document."""
    input:
        mono=CORPUS["mono"],
        tokenizer=TOKENIZER,
    output:
        [R("data", f"mixture/{{name}}/{f}") for f in MIXTURE_FILES],
    wildcard_constraints:
        name="multilingual|english",
    params:
        cfg=lambda wc: mixture_params(wc.name),
        outdir=lambda wc: R("data", f"mixture/{wc.name}"),
    log:
        LOG("data", "mixture_{name}"),
    benchmark:
        BENCH("data", "mixture_{name}")
    resources:
        mem_mb=8000,
        runtime=60,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{PY} workflow_scripts/pack_mixture.py --params {params.cfg:q} --mono {input.mono} "
        "--tokenizer {input.tokenizer} --out {params.outdir} > {log} 2>&1"


rule spaced_retrieval:
    """Seeded Spaced Retrieval splits: `$ X1..Xt _*g $ X1..Xt`, loss on the answer digits only."""
    output:
        [R("data", f"spaced_retrieval/{s}.parquet") for s in SR_SPLITS],
    params:
        cfg=as_json({**DATA["spaced_retrieval"], "seed": C["seed"]}),
        outdir=R("data", "spaced_retrieval"),
    log:
        LOG("data", "spaced_retrieval"),
    benchmark:
        BENCH("data", "spaced_retrieval")
    resources:
        mem_mb=2000,
        runtime=10,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{PY} workflow_scripts/make_spaced_retrieval.py --params {params.cfg:q} --out {params.outdir} "
        "> {log} 2>&1"


rule data:
    """Phase target: everything the data phase produces."""
    input:
        CORPUS.values(),
        TOKENIZER,
        [R("data", f"mixture/{n}/{f}") for n in ("multilingual", "english") for f in MIXTURE_FILES],
        [R("data", f"spaced_retrieval/{s}.parquet") for s in SR_SPLITS],
