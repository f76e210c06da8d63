# Data phase: parallel + monolingual corpus (offline packages or the hub), tokenizer, packed training
# mixtures, Spaced Retrieval splits. Every output has the same schema whatever the source.

CORPUS = {
    "parallel": R("data", "corpus/parallel.parquet"),
    "mono": R("data", "corpus/mono.parquet"),
    "manifest": R("data", "corpus/manifest.json"),
}
MIXTURE_FILES = ["tokens.npy", "doc_starts.npy", "doc_offsets.npy", "meta.parquet", "stats.json"]


def _tokenizer_plan():
    """One tokenizer per distinct model vocabulary (hybridlab.data.tokenizer.tokenizer_plan), checked once."""
    from hybridlab.data.tokenizer import tokenizer_plan

    try:
        return tokenizer_plan(C)
    except HybridlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


# sources: {name: hub id / local dir / None (BPE trained here)}; teachers: {teacher: name}; bld_nl: name.
TOK_PLAN = _tokenizer_plan()
TOKENIZERS = list(TOK_PLAN["sources"])


def tokenizer_dir(tok):
    return R("data", f"tokenizer/{tok}")


def tokenizer_file(tok):
    return f"{tokenizer_dir(tok)}/tokenizer.json"


def mixture_dir(tok, name):
    """Packed mixture `name` (multilingual | english) tokenised with tokenizer `tok`."""
    return R("data", f"mixture/{tok}/{name}")


def mixture_files(tok, name):
    return [f"{mixture_dir(tok, name)}/{f}" for f in MIXTURE_FILES]


def teacher_tok(teacher):
    return TOK_PLAN["teachers"][teacher]


BLD_NL_TOK = TOK_PLAN["bld_nl"]
# data.packing.document_mask: training and held-out evaluation keep attention and recurrent state inside
# each packed document (the mixtures' doc_starts.npy). Only a true value enters a job's params, so the
# default leaves existing runs' params (and their outputs) as they are.
DOCUMENT_MASK = {"document_mask": True} if DATA.get("packing", {}).get("document_mask") else {}
# Every mixture the DAG builds: a multilingual one per teacher tokenizer, an English one for BLD-NL's.
MIXTURES = [(t, "multilingual") for t in TOK_PLAN["multilingual"]] + [(t, "english") for t in TOK_PLAN["english"]]
SR_SPLITS = ["train", "val", "test"]


from hybridlab.data.local_sources import DATASET_KEYS as LOCAL_DATASET_KEYS, job_environment, local_sources

# Every job of the preset gets HF_HOME / HF_HUB_OFFLINE / the model-directory map of `local_sources`
# (set here, at parse time, so local jobs and cluster jobs, which re-parse the Snakefile, inherit it).
os.environ.update(job_environment(C))


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
        # local copies in the hub layouts (config `local_sources`; None = the hub or the HF cache)
        src = local_sources(C)
        p.update(english=C["languages"]["english"], local_sources={k: src[k] for k in LOCAL_DATASET_KEYS})
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
        R("data", "tokenizer/{tok}/tokenizer.json"),
    wildcard_constraints:
        tok="|".join(TOKENIZERS),
    params:
        outdir=lambda wc: tokenizer_dir(wc.tok),
        cfg=lambda wc: as_json({"vocab_size": DATA.get("tokenizer_vocab_size"),
                                "hub_tokenizer": TOK_PLAN["sources"][wc.tok], "seed": C["seed"]}),
    log:
        LOG("data", "tokenizer_{tok}"),
    benchmark:
        BENCH("data", "tokenizer_{tok}")
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
    block_rows = 1
    if name == "multilingual":
        langs, share = DATA["mono_languages"], DATA["english_share"]
    else:  # English-only text for BLD natural-language pre-training (DCLM at paper scale)
        langs, share = [], 1.0
        # A BLD-NL sequence joins context_len / seq_len consecutive rows: keep them together when shuffling.
        ctx = C.get("train", {}).get("bld_nl", {}).get("context_len", DATA["seq_len"])
        block_rows = ctx // DATA["seq_len"] if ctx % DATA["seq_len"] == 0 else 1
    p = {"languages": langs, "english": C["languages"]["english"], "english_share": share,
         "seq_len": DATA["seq_len"], "total_tokens": DATA["mixture_tokens"], "block_rows": block_rows,
         "val_fraction": DATA["val_fraction"], "seed": C["seed"]}
    if name == "english" and DATA.get("bld_nl_stream"):
        # Sized to the budget: stream the web source until the largest BLD-NL arm's tokens are packed.
        bld = C["train"]["bld_nl"]
        src = DATA["bld_nl_stream"]["source"]
        p.update(stream={**DATA["bld_nl_stream"], "path": local_sources(C)[src]},  # local copy, else the hub
                 bld_nl={"sizes": bld["sizes"], "experiment": C["experiments"]["bld_nl"],
                         "run": {k: v for k, v in bld.items() if k != "sizes"}})
    return as_json(p)


rule mixture:
    """Tokenised, packed fixed-length sequences (one language per sequence), train/val by document, per tokenizer."""
    input:
        mono=CORPUS["mono"],
        tokenizer=lambda wc: tokenizer_file(wc.tok),
    output:
        [R("data", f"mixture/{{tok}}/{{name}}/{f}") for f in MIXTURE_FILES],
    wildcard_constraints:
        tok="|".join(TOKENIZERS),
        name="multilingual|english",
    params:
        cfg=lambda wc: mixture_params(wc.name),
        outdir=lambda wc: mixture_dir(wc.tok, wc.name),
    log:
        LOG("data", "mixture_{tok}_{name}"),
    benchmark:
        BENCH("data", "mixture_{tok}_{name}")
    resources:
        mem_mb=8000,
        runtime=60 if OFFLINE else 2880,  # paper: tens of billions of English tokens for BLD-NL
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
        [tokenizer_file(t) for t in TOKENIZERS],
        [f for t, n in MIXTURES for f in mixture_files(t, n)],
        [R("data", f"spaced_retrieval/{s}.parquet") for s in SR_SPLITS],
