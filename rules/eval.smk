# Eval phase: one tidy parquet table per analysis (schemas documented in the README).
# Each analysis has its own rule, named eval_<analysis>, writing results/eval/<scale>/<analysis>.parquet.

import shlex

EVAL_TABLES = ["softcka", "recency", "fertility", "perplexity", "niah", "retrieval_score", "retrieval_heads",
               "position_loss"]


def distilled_students(seeds=None):
    """Final (stage-2) student directories (save_hybrid layout: config.json, model.safetensors, hybrid.json) of
    every student x replicate seed (`seeds`, default experiments.distill.seeds)."""
    return [distill_dir(t, p, m, "stage2", s) for t, p, m in STUDENTS for s in (seeds or DISTILL_SEEDS)]


# The analyses of the multilinguality study (SoftCKA, recency, NIAH; lm-eval) and the BLD-NL retrieval-head and
# position-loss analyses read the models of the FIRST replicate seed only (their cost grows with every model;
# their intervals are bootstraps / Wilson intervals over sentences, sequences and examples of that seed). The
# findings' comparisons (perplexity / KL per placement, BLD-SR, BLD-NL held-out CE) use every seed.
ANALYSIS_SEED = DISTILL_SEEDS[0]
NL_ANALYSIS_SEED = NL_SEEDS[0]


def analysis_models_param():
    """Which models the SoftCKA / recency / NIAH / fertility rules analyse (hybridlab.eval.pairs)."""
    A = C.get("eval", {}).get("analysis")
    if A is None:
        print(f"error: config: presets.{SCALE}.eval.analysis is missing; copy it from another preset",
              file=sys.stderr)
        sys.exit(1)
    distilled = [{"teacher": t.replace("--", "/"), "teacher_path": teacher_dir(t), "student": f"{p}-{m}",
                  "student_path": distill_dir(t, p, m, "stage2", ANALYSIS_SEED),
                  "tokenizer": tokenizer_dir(teacher_tok(t)) if OFFLINE else teacher_dir(t)}
                 for t, p, m in STUDENTS] if A["include_distilled"] else []
    return {"distilled": distilled, "hub_pairs": A["hub_pairs"]}


def analysis_params(section):
    A = C["eval"]["analysis"]
    return as_json({"models": analysis_models_param(), "dtype": A["dtype"], "seed": C["seed"],
                    "english": C["languages"]["english"], section: A[section]})


def analysis_inputs():
    """The DAG models the analyses read (none when only hub models are analysed)."""
    if not C.get("eval", {}).get("analysis", {}).get("include_distilled", False):
        return []
    return ([f"{teacher_dir(t)}/{f}" for t in TEACHERS for f in MODEL_FILES]
            + [f"{d}/{f}" for d in distilled_students([ANALYSIS_SEED]) for f in ("model.safetensors", "hybrid.json")])


rule eval_softcka:
    """SoftCKA and per-pair alignment by layer, English vs each language, hidden states and attn_delta."""
    input:
        models=analysis_inputs(),
        parallel=CORPUS["parallel"],
        tokenizer=[tokenizer_file(t) for t in TOKENIZERS],
    output:
        R("eval", "softcka.parquet"),
    params:
        cfg=analysis_params("softcka"),
    threads: 1 if not ON_GPU else 8
    log:
        LOG("eval", "softcka"),
    benchmark:
        BENCH("eval", "softcka")
    resources:
        mem_mb=8000 if OFFLINE else 64000,
        runtime=30 if OFFLINE else 720,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/eval_softcka.py --params {params.cfg:q} --parallel {input.parallel} "
        "--out {output} > {log} 2>&1"


rule eval_recency:
    """Attention mass on the last w tokens and mean attention distance per FA layer and head."""
    input:
        models=analysis_inputs(),
        mono=CORPUS["mono"],
        tokenizer=[tokenizer_file(t) for t in TOKENIZERS],
    output:
        R("eval", "recency.parquet"),
    params:
        cfg=analysis_params("recency"),
    threads: 1 if not ON_GPU else 8
    log:
        LOG("eval", "recency"),
    benchmark:
        BENCH("eval", "recency")
    resources:
        mem_mb=8000 if OFFLINE else 64000,
        runtime=30 if OFFLINE else 240,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/eval_recency.py --params {params.cfg:q} --mono {input.mono} --out {output} "
        "> {log} 2>&1"


rule eval_fertility:
    """Tokens per sentence relative to English per tokenizer and language."""
    input:
        parallel=CORPUS["parallel"],
        tokenizer=tokenizer_file(BLD_NL_TOK),
    output:
        R("eval", "fertility.parquet"),
    params:
        cfg=analysis_params("fertility"),
        tokdir=tokenizer_dir(BLD_NL_TOK),
    threads: 1
    log:
        LOG("eval", "fertility"),
    benchmark:
        BENCH("eval", "fertility")
    resources:
        mem_mb=4000,
        runtime=20,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{PY} workflow_scripts/eval_fertility.py --params {params.cfg:q} --parallel {input.parallel} "
        "--tokenizer {params.tokdir} --out {output} > {log} 2>&1"


rule eval_perplexity:
    """Per-language CE / perplexity / KL to the teacher for teachers and students; tokens to baseline."""
    input:
        teachers=[f"{teacher_dir(t)}/model.safetensors" for t in TEACHERS],
        students=[f"{d}/{f}" for d in distilled_students() for f in ("model.safetensors", "hybrid.json", "metrics.parquet")],
        mixture=[f for t in TOK_PLAN["multilingual"] for f in mixture_files(t, "multilingual")],
    output:
        table=R("eval", "perplexity.parquet"),
        tokens=R("eval", "tokens_to_baseline.parquet"),
        rows=R("eval", "perplexity_rows.parquet"),
    params:
        cfg=as_json({
            "teachers": {t: teacher_dir(t) for t in TEACHERS},
            "students": [{"teacher": t, "placement": p, "mixer": m, "seed": s,
                          "dir": distill_dir(t, p, m, "stage2", s)} for t, p, m in STUDENTS for s in DISTILL_SEEDS],
            "rows_per_language": C["train"]["distill"]["table_rows_per_language"],
            "batch_size": C["train"]["distill"]["eval_batch_size"],
            "baseline_placement": C["experiments"]["distill"]["baseline_placement"],
            # each teacher and its students are evaluated on the mixture of the teacher's tokenizer
            "mixtures": {t: mixture_dir(teacher_tok(t), "multilingual") for t in TEACHERS},
        }),
        mixture=mixture_dir(teacher_tok(TEACHERS[0]), "multilingual"),
    log:
        LOG("eval", "perplexity"),
    benchmark:
        BENCH("eval", "perplexity")
    resources:
        mem_mb=16000 if OFFLINE else 64000,
        runtime=60 if OFFLINE else 240,
        gpu=gpus("eval_perplexity"),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/eval_perplexity.py --params {params.cfg:q} --mixture {params.mixture} "
        "--out {output.table} --tokens-out {output.tokens} --rows-out {output.rows} > {log} 2>&1"


rule eval_niah:
    """OneRULER-style NIAH accuracy, runtime, peak memory and OOM per language and context length."""
    input:
        models=analysis_inputs(),
        mono=CORPUS["mono"],
        tokenizer=[tokenizer_file(t) for t in TOKENIZERS],
    output:
        table=R("eval", "niah.parquet"),
        examples=R("eval", "niah_examples.parquet"),
    params:
        cfg=analysis_params("niah"),
    threads: 1 if not ON_GPU else 8
    log:
        LOG("eval", "niah"),
    benchmark:
        BENCH("eval", "niah")
    resources:
        mem_mb=8000 if OFFLINE else 96000,
        runtime=30 if OFFLINE else 1440,
        gpu=gpus("eval_niah"),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/eval_niah.py --params {params.cfg:q} --mono {input.mono} --out {output.table} "
        "--examples {output.examples} > {log} 2>&1"


rule eval_retrieval_score:
    """Layer Retrieval Ability Score by activation patching per layer and checkpoint (Spaced Retrieval)."""
    input:
        models=lambda wc: [f"{bld_sr_dir(a, s)}/model.safetensors" for a in bld_sr_arms() for s in SR_SEEDS],
        indices=lambda wc: [f"{bld_sr_dir(a, s)}/score_checkpoints/index.json" for a in bld_sr_arms() for s in SR_SEEDS],
        test=R("data", "spaced_retrieval/test.parquet"),
    output:
        R("eval", "retrieval_score.parquet"),
    params:
        cfg=as_json({**C["eval"]["retrieval_score"], "seed": C["seed"]}),
        arms=lambda wc: [bld_sr_dir(a, s) for a in bld_sr_arms() for s in SR_SEEDS],
    threads: 1 if not ON_GPU else 8
    log:
        LOG("eval", "retrieval_score"),
    benchmark:
        BENCH("eval", "retrieval_score")
    resources:
        mem_mb=8000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/eval_retrieval_score.py --params {params.cfg:q} --arms {params.arms} "
        "--test {input.test} --out {output} --threads {threads} > {log} 2>&1"


def heads_position_params(section):
    """Params of the retrieval-heads / position-loss / lm-eval rules (presets.<scale>.eval.heads_position)."""
    hp = C.get("eval", {}).get("heads_position")
    if hp is None or section not in hp:
        print(f"error: config: presets.{SCALE}.eval.heads_position.{section} is missing", file=sys.stderr)
        sys.exit(1)
    return as_json({section: hp[section], "seed": C["seed"], "device": "cuda" if ON_GPU else "cpu",
                    "dtype": "bfloat16" if PAPER_PATH else "float32"})


def bld_nl_dirs():
    """BLD-NL arm directories of the first replicate seed (the retrieval-head, position-loss and lm-eval analyses)."""
    return [bld_nl_dir(a, NL_ANALYSIS_SEED) for a in bld_nl_arms()]


rule eval_retrieval_heads:
    """DuoAttention-style per-KV-head gates and accuracy as heads are masked from lowest gate up."""
    input:
        models=[f"{d}/{f}" for d in bld_nl_dirs() for f in ("model.safetensors", "hybrid.json")],
        mixture=mixture_files(BLD_NL_TOK, "english"),
        tokenizer=tokenizer_file(BLD_NL_TOK),
    output:
        alphas=R("eval", "retrieval_heads.parquet"),
        curve=R("eval", "retrieval_heads_masking.parquet"),
    params:
        cfg=heads_position_params("retrieval_heads"),
        models=bld_nl_dirs(),
        mixture=mixture_dir(BLD_NL_TOK, "english"),
        tokdir=tokenizer_dir(BLD_NL_TOK),
        work=R("eval", "runs/retrieval_heads"),
    log:
        LOG("eval", "retrieval_heads"),
    benchmark:
        BENCH("eval", "retrieval_heads")
    threads: 1 if not ON_GPU else 8
    resources:
        mem_mb=8000 if OFFLINE else 80000,
        runtime=60 if OFFLINE else 600,
        gpu=gpus("eval_retrieval_heads"),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/eval_retrieval_heads.py --params {params.cfg:q} --models {params.models} "
        "--mixture {params.mixture} --tokenizer {params.tokdir} --work {params.work} --out {output.alphas} "
        "--curve {output.curve} --threads {threads} > {log} 2>&1"


rule eval_position_loss:
    """Loss by token-position bucket on long held-out documents and LongPPL, every BLD-NL arm."""
    input:
        models=[f"{d}/{f}" for d in bld_nl_dirs() for f in ("model.safetensors", "hybrid.json")],
        mixture=mixture_files(BLD_NL_TOK, "english"),
        tokenizer=tokenizer_file(BLD_NL_TOK),
    output:
        buckets=R("eval", "position_loss.parquet"),
        summary=R("eval", "position_loss_summary.parquet"),
    params:
        cfg=heads_position_params("position_loss"),
        models=bld_nl_dirs(),
        mixture=mixture_dir(BLD_NL_TOK, "english"),
        tokdir=tokenizer_dir(BLD_NL_TOK),
        # documents: pg19 from local_sources.pg19 when set, else the hub or the HF cache
        pg19=f"--pg19-local {shlex.quote(str(local_sources(C)['pg19']))}" if local_sources(C)["pg19"] else "",
    log:
        LOG("eval", "position_loss"),
    benchmark:
        BENCH("eval", "position_loss")
    threads: 1 if not ON_GPU else 8
    resources:
        mem_mb=8000 if OFFLINE else 80000,
        runtime=60 if OFFLINE else 600,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/eval_position_loss.py --params {params.cfg:q} --models {params.models} "
        "--mixture {params.mixture} --tokenizer {params.tokdir} {params.pg19} "
        "--out {output.buckets} --summary {output.summary} --threads {threads} > {log} 2>&1"


# Paper (and rehearsal) preset only: lm-eval benchmarks on the teachers, the distilled students and every BLD-NL arm.
LM_BENCHMARK_MODELS = (([teacher_dir(t) for t in TEACHERS] + distilled_students([ANALYSIS_SEED]) + bld_nl_dirs())
                       if PAPER_PATH else [])
# Each model's own tokenizer: a teacher's (saved next to it) for the teacher and its students, BLD-NL's for its arms.
LM_BENCHMARK_TOKENIZERS = ([teacher_dir(t) for t in TEACHERS] + [teacher_dir(t) for t, p, m in STUDENTS]
                           + [tokenizer_dir(BLD_NL_TOK)] * len(bld_nl_dirs())) if PAPER_PATH else []


rule eval_lm_benchmarks:
    """lm-eval: arc, hellaswag, piqa, boolq, winogrande, lambada, wikitext, the six recall tasks, RULER 1K-16K."""
    input:
        models=[f"{d}/model.safetensors" for d in LM_BENCHMARK_MODELS],
        tokenizer=[tokenizer_file(t) for t in TOKENIZERS],
    output:
        R("eval", "lm_benchmarks.parquet"),
    params:
        cfg=lambda wc: heads_position_params("lm_eval"),
        models=LM_BENCHMARK_MODELS,
        tokdirs=LM_BENCHMARK_TOKENIZERS,
    log:
        LOG("eval", "lm_benchmarks"),
    benchmark:
        BENCH("eval", "lm_benchmarks")
    resources:
        mem_mb=80000,
        runtime=1440,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/eval_lm_benchmarks.py --params {params.cfg:q} --models {params.models} "
        "--tokenizer {params.tokdirs} --out {output} > {log} 2>&1"


rule eval:
    """Phase target: every analysis table."""
    input:
        [R("eval", f"{name}.parquet") for name in EVAL_TABLES],
        [R("eval", "lm_benchmarks.parquet")] if PAPER_PATH else [],
