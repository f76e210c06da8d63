# Data phase: parallel + monolingual corpus (offline packages or the hub), tokenizer, packed training
# mixtures, Spaced Retrieval splits. Every output has the same schema whatever the source.


rule corpus:
    """Parallel (FLoRes-like, N-way) and monolingual text per language, plus a manifest of sources."""
    output:
        **CORPUS,
    log:
        LOG("data", "corpus"),
    benchmark:
        BENCH("data", "corpus")
    priority: PRIORITY["data"]
    conda:
        CPU_ENV
    resources:
        **job_resources("corpus"),
    params:
        cfg=corpus_params(),
        script="build_offline_corpus.py" if OFFLINE else "build_hub_corpus.py",
        cache=f"{CACHE_DIR}/offline",
        outdir=output_dir("parallel"),
    shell:
        "python workflow_scripts/{params.script} --params {params.cfg:q} --cache {params.cache} "
        "--out {params.outdir} > {log} 2>&1"


rule tokenizer:
    """Byte-level BPE trained on the corpus (smoke/tiny) or the hub tokenizer saved locally (paper)."""
    input:
        mono=CORPUS["mono"],
        gguf_teacher=lambda wc: (
            [f"{teacher_dir(GGUF_TOKENIZERS[wc.tok])}/config.json"] if wc.tok in GGUF_TOKENIZERS else []
        ),
    output:
        R("data", "tokenizer/{tok}/tokenizer.json"),
    log:
        LOG("data", "tokenizer_{tok}"),
    benchmark:
        BENCH("data", "tokenizer_{tok}")
    wildcard_constraints:
        tok="|".join(TOKENIZERS),
    priority: PRIORITY["data"]
    conda:
        CPU_ENV
    resources:
        **job_resources("tokenizer"),
    params:
        outdir=lambda wc: tokenizer_dir(wc.tok),
        cfg=lambda wc: as_json(
            {
                "vocab_size": DATA.get("tokenizer_vocab_size"),
                # a GGUF teacher's tokenizer is read from its converted directory
                "hub_tokenizer": (
                    teacher_dir(GGUF_TOKENIZERS[wc.tok]) if wc.tok in GGUF_TOKENIZERS else TOK_PLAN["sources"][wc.tok]
                ),
                "seed": C["seed"],
            }
        ),
    shell:
        "python workflow_scripts/train_tokenizer.py --params {params.cfg:q} --mono {input.mono} "
        "--out {params.outdir} > {log} 2>&1"


rule mixture:
    """Tokenised, packed fixed-length sequences (one language per sequence), train/val by document, per tokenizer."""
    input:
        mono=CORPUS["mono"],
        parallel=CORPUS["parallel"],
        tokenizer=lambda wc: tokenizer_file(wc.tok),
    output:
        [R("data", f"mixture/{{tok}}/{{name}}/{f}") for f in MIXTURE_FILES],
    log:
        LOG("data", "mixture_{tok}_{name}"),
    benchmark:
        BENCH("data", "mixture_{tok}_{name}")
    wildcard_constraints:
        tok="|".join(TOKENIZERS),
        name="multilingual|english",
    priority: PRIORITY["data"]
    conda:
        CPU_ENV
    resources:
        **job_resources("mixture"),
    params:
        cfg=lambda wc: mixture_params(wc.name),
        outdir=lambda wc: mixture_dir(wc.tok, wc.name),
    shell:
        "python workflow_scripts/pack_mixture.py --params {params.cfg:q} --mono {input.mono} "
        "--tokenizer {input.tokenizer} --parallel {input.parallel} --out {params.outdir} > {log} 2>&1"


rule spaced_retrieval:
    """Seeded Spaced Retrieval splits: `$ X1..Xt _*g $ X1..Xt`, loss on the answer digits only."""
    output:
        [R("data", f"spaced_retrieval/{s}.parquet") for s in SR_SPLITS],
    log:
        LOG("data", "spaced_retrieval"),
    benchmark:
        BENCH("data", "spaced_retrieval")
    priority: PRIORITY["data"]
    conda:
        CPU_ENV
    resources:
        **job_resources("spaced_retrieval"),
    params:
        cfg=as_json({**DATA["spaced_retrieval"], "seed": C["seed"]}),
        outdir=output_dir(),
    shell:
        "python workflow_scripts/make_spaced_retrieval.py --params {params.cfg:q} --out {params.outdir} " "> {log} 2>&1"


rule data:
    """Phase target: everything the data phase produces."""
    input:
        CORPUS.values(),
        [tokenizer_file(t) for t in TOKENIZERS],
        [f for t, n in MIXTURES for f in mixture_files(t, n)],
        [R("data", f"spaced_retrieval/{s}.parquet") for s in SR_SPLITS] if BLD_STUDY else [],
