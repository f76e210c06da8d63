# Eval phase: one tidy parquet table per analysis (schemas documented in the README).
# Each analysis has its own rule, named eval_<analysis>, writing results/eval/<scale>/<analysis>.parquet.


rule eval_softcka_model:
    """SoftCKA and per-pair alignment by layer of one model of one replicate seed, English vs each language,
    hidden states and attn_delta (one job per model, so a time-out or a crash costs one model's work)."""
    input:
        models=lambda wc: model_inputs(softcka_model(wc)),
        parallel=CORPUS["parallel"],
        tokenizer=[tokenizer_file(t) for t in TOKENIZERS],
    output:
        R("eval", "softcka/seed{seed}/{model}.parquet"),
    log:
        LOG("eval", "softcka/seed{seed}/{model}"),
    benchmark:
        BENCH("eval", "softcka/seed{seed}/{model}")
    wildcard_constraints:
        seed=SEED_RE,
        model=wildcard_choice(sorted({slug for models in SOFTCKA_MODELS.values() for slug in models})),
    priority: PRIORITY["softcka"]
    conda:
        CUDA_ENV
    threads: 1 if not ON_GPU else 8
    resources:
        **job_resources("eval_softcka_model", gpus(1), model=lambda wc: hub_id(softcka_model(wc))),
    params:
        cfg=lambda wc: model_params("softcka", wc.model, softcka_seed_arg(wc.seed)),
        name=lambda wc: softcka_model(wc).name,
    shell:
        "python workflow_scripts/eval_softcka.py --params {params.cfg:q} --parallel {input.parallel} "
        "--model {params.name:q} --out {output} > {log} 2>&1"


rule eval_softcka:
    """The SoftCKA table of the first replicate seed's models (and the hub pairs), gathered from the per-model jobs."""
    input:
        softcka_model_files(ANALYSIS_SEED),
    output:
        R("eval", "softcka.parquet"),
    log:
        LOG("eval", "softcka"),
    priority: PRIORITY["eval"]
    conda:
        CPU_ENV
    resources:
        **job_resources("eval_softcka"),
    params:
        cfg=softcka_gather_params(ANALYSIS_SEED),
    shell:
        "python workflow_scripts/gather_eval.py softcka --params {params.cfg:q} --inputs {input} --out {output} "
        "> {log} 2>&1"


rule eval_softcka_seed:
    """The SoftCKA table of a further replicate seed's distilled students and their teacher (the teacher's rows
    from its first-seed job), as eval_softcka."""
    input:
        lambda wc: softcka_model_files(int(wc.seed)),
    output:
        R("eval", "softcka_seed{seed}.parquet"),
    log:
        LOG("eval", "softcka_seed{seed}"),
    wildcard_constraints:
        seed=SEED_RE,
    priority: PRIORITY["eval"]
    conda:
        CPU_ENV
    resources:
        **job_resources("eval_softcka_seed"),
    params:
        cfg=lambda wc: softcka_gather_params(int(wc.seed)),
    shell:
        "python workflow_scripts/gather_eval.py softcka --params {params.cfg:q} --inputs {input} --out {output} "
        "> {log} 2>&1"


rule eval_recency:
    """Attention mass on the last w tokens and mean attention distance per FA layer and head."""
    input:
        models=analysis_inputs(),
        mono=CORPUS["mono"],
        tokenizer=[tokenizer_file(t) for t in TOKENIZERS],
    output:
        R("eval", "recency.parquet"),
    log:
        LOG("eval", "recency"),
    benchmark:
        BENCH("eval", "recency")
    priority: PRIORITY["eval"]
    conda:
        CUDA_ENV
    threads: 1 if not ON_GPU else 8
    resources:
        **job_resources("eval_recency", gpus(1)),
    params:
        cfg=analysis_params("recency"),
    shell:
        "python workflow_scripts/eval_recency.py --params {params.cfg:q} --mono {input.mono} --out {output} "
        "> {log} 2>&1"


rule eval_fertility:
    """Tokens per sentence relative to English per tokenizer and language."""
    input:
        parallel=CORPUS["parallel"],
        tokenizer=tokenizer_file(BLD_NL_TOK),
    output:
        R("eval", "fertility.parquet"),
    log:
        LOG("eval", "fertility"),
    benchmark:
        BENCH("eval", "fertility")
    priority: PRIORITY["eval"]
    conda:
        CPU_ENV
    threads: 1
    resources:
        **job_resources("eval_fertility"),
    params:
        cfg=analysis_params("fertility"),
        tokdir=input_dir("tokenizer"),
    shell:
        "python workflow_scripts/eval_fertility.py --params {params.cfg:q} --parallel {input.parallel} "
        "--tokenizer {params.tokdir} --out {output} > {log} 2>&1"


rule eval_perplexity:
    """Per-language CE / perplexity / KL to the teacher for teachers and students; tokens to baseline."""
    input:
        teachers=[f"{teacher_dir(t)}/model.safetensors" for t in TEACHERS],
        students=[
            f"{d}/{f}" for d in distilled_students() for f in ("model.safetensors", "hybrid.json", "metrics.parquet")
        ],
        # --mixture is the first teacher's; params.cfg names every teacher's mixture
        mixture=mixture_files(teacher_tok(TEACHERS[0]), "multilingual"),
        mixtures=[f for t in TOK_PLAN["multilingual"] for f in mixture_files(t, "multilingual")],
    output:
        table=R("eval", "perplexity.parquet"),
        tokens=R("eval", "tokens_to_baseline.parquet"),
        rows=R("eval", "perplexity_rows.parquet"),
    log:
        LOG("eval", "perplexity"),
    benchmark:
        BENCH("eval", "perplexity")
    priority: PRIORITY["eval"]
    conda:
        CUDA_ENV
    # It waits for every student, so on CPU it is the build's last long job: with every core it does not leave
    # one idle while it runs alone.
    threads: 8 if ON_GPU else workflow.cores
    resources:
        **job_resources("eval_perplexity", gpus("eval_perplexity")),
    params:
        cfg=as_json(
            {
                "teachers": {t: teacher_dir(t) for t in TEACHERS},
                "students": [
                    {"teacher": t, "placement": p, "mixer": m, "seed": s, "dir": distill_dir(t, p, m, "stage2", s)}
                    for t, p, m, s in DISTILL_RUNS
                ],
                "rows_per_language": C["train"]["distill"]["table_rows_per_language"],
                "batch_size": C["train"]["distill"]["eval_batch_size"],
                **({"dtype": C["train"]["distill"]["eval_dtype"]} if "eval_dtype" in C["train"]["distill"] else {}),
                "baseline_placement": C["experiments"]["distill"]["baseline_placement"],
                # each teacher and its students are evaluated on the mixture of the teacher's tokenizer
                "mixtures": {t: mixture_dir(teacher_tok(t), "multilingual") for t in TEACHERS},
            }
        ),
        mixture=input_dir("mixture"),
    shell:
        "python workflow_scripts/eval_perplexity.py --params {params.cfg:q} --mixture {params.mixture} "
        "--out {output.table} --tokens-out {output.tokens} --rows-out {output.rows} > {log} 2>&1"


rule eval_niah:
    """OneRULER-style NIAH of one model: per-example accuracy, runtime, peak memory and OOM per language, task
    and context length (a rerun reuses the tasks a killed job finished)."""
    input:
        models=lambda wc: model_inputs(NIAH_MODELS[wc.model]),
        mono=CORPUS["mono"],
        tokenizer=[tokenizer_file(t) for t in TOKENIZERS],
    output:
        R("eval", "niah/{model}.parquet"),
    log:
        LOG("eval", "niah/{model}"),
    benchmark:
        BENCH("eval", "niah/{model}")
    wildcard_constraints:
        model=wildcard_choice(NIAH_MODELS),
    priority: PRIORITY["eval"]
    conda:
        CUDA_ENV
    threads: 1 if not ON_GPU else 8
    resources:
        **job_resources("eval_niah", gpus("eval_niah"), model=lambda wc: hub_id(NIAH_MODELS[wc.model])),
    params:
        cfg=lambda wc: model_params("niah", wc.model),
        name=lambda wc: NIAH_MODELS[wc.model].name,
        work=lambda wc: R("eval", f"runs/niah/{wc.model}"),
    shell:
        "python workflow_scripts/eval_niah.py --params {params.cfg:q} --mono {input.mono} --model {params.name:q} "
        "--work {params.work} --examples {output} > {log} 2>&1"


rule niah_tables:
    """The NIAH summary and per-example tables of every model, gathered from the per-model jobs."""
    input:
        [R("eval", f"niah/{slug}.parquet") for slug in NIAH_MODELS],
    output:
        table=R("eval", "niah.parquet"),
        examples=R("eval", "niah_examples.parquet"),
    log:
        LOG("eval", "niah"),
    priority: PRIORITY["eval"]
    conda:
        CPU_ENV
    resources:
        **job_resources("niah_tables"),
    params:
        cfg=as_json({"models": [m.name for m in NIAH_MODELS.values()]}),
    shell:
        "python workflow_scripts/gather_eval.py niah --params {params.cfg:q} --inputs {input} --out {output.table} "
        "--examples {output.examples} > {log} 2>&1"


rule eval_retrieval_score:
    """Layer Retrieval Ability Score by activation patching per layer and checkpoint (Spaced Retrieval)."""
    input:
        models=lambda wc: [f"{bld_sr_dir(a, s)}/model.safetensors" for a in bld_sr_arms() for s in SR_SEEDS],
        indices=lambda wc: [f"{bld_sr_dir(a, s)}/score_checkpoints/index.json" for a in bld_sr_arms() for s in SR_SEEDS],
        test=R("data", "spaced_retrieval/test.parquet"),
    output:
        R("eval", "retrieval_score.parquet"),
    log:
        LOG("eval", "retrieval_score"),
    benchmark:
        BENCH("eval", "retrieval_score")
    priority: PRIORITY["sr_eval"]
    conda:
        CUDA_ENV
    threads: 1 if not ON_GPU else 8
    resources:
        **job_resources("eval_retrieval_score", gpus(1)),
    params:
        cfg=lambda wc: as_json({**C["eval"]["retrieval_score"], "seed": C["seed"]}),
        arms=lambda wc: [bld_sr_dir(a, s) for a in bld_sr_arms() for s in SR_SEEDS],
    shell:
        "python workflow_scripts/eval_retrieval_score.py --params {params.cfg:q} --arms {params.arms} "
        "--test {input.test} --out {output} --threads {threads} > {log} 2>&1"


rule eval_retrieval_heads:
    """DuoAttention-style per-KV-head gates and accuracy as heads are masked from lowest gate up."""
    input:
        models=[f"{d}/{f}" for d in bld_nl_dirs() for f in ("model.safetensors", "hybrid.json")],
        mixture=mixture_files(BLD_NL_TOK, "english"),
        tokenizer=tokenizer_file(BLD_NL_TOK),
    output:
        alphas=R("eval", "retrieval_heads.parquet"),
        curve=R("eval", "retrieval_heads_masking.parquet"),
    log:
        LOG("eval", "retrieval_heads"),
    benchmark:
        BENCH("eval", "retrieval_heads")
    priority: PRIORITY["nl_eval"]
    conda:
        CUDA_ENV
    threads: 1 if not ON_GPU else 8
    resources:
        **job_resources("eval_retrieval_heads", gpus("eval_retrieval_heads")),
    params:
        cfg=lambda wc: heads_position_params("retrieval_heads"),
        models=bld_nl_dirs(),
        mixture=input_dir("mixture"),
        tokdir=input_dir("tokenizer"),
        work=R("eval", "runs/retrieval_heads"),
    shell:
        "python workflow_scripts/eval_retrieval_heads.py --params {params.cfg:q} --models {params.models} "
        "--mixture {params.mixture} --tokenizer {params.tokdir} --work {params.work} --out {output.alphas} "
        "--curve {output.curve} --threads {threads} > {log} 2>&1"


rule eval_position_loss:
    """Loss by token-position bucket on long held-out documents and LongPPL, every BLD-NL arm."""
    input:
        models=[f"{d}/{f}" for d in bld_nl_dirs() for f in ("model.safetensors", "hybrid.json")],
        mixture=mixture_files(BLD_NL_TOK, "english"),
        tokenizer=tokenizer_file(BLD_NL_TOK),
        # LongPPL's external evaluator: a teacher with the BLD-NL tokenizer (position_loss.evaluator), else none
        evaluator=(
            [f"{teacher_dir(POSITION_LOSS_EVALUATOR)}/{f}" for f in MODEL_FILES] if POSITION_LOSS_EVALUATOR else []
        ),
    output:
        buckets=R("eval", "position_loss.parquet"),
        summary=R("eval", "position_loss_summary.parquet"),
    log:
        LOG("eval", "position_loss"),
    benchmark:
        BENCH("eval", "position_loss")
    priority: PRIORITY["nl_eval"]
    conda:
        CUDA_ENV
    threads: 1 if not ON_GPU else 8
    resources:
        **job_resources("eval_position_loss", gpus(1)),
    params:
        cfg=lambda wc: heads_position_params("position_loss"),
        models=bld_nl_dirs(),
        mixture=input_dir("mixture"),
        tokdir=input_dir("tokenizer"),
        # documents: pg19 from local_sources.pg19 when set, else the hub or the HF cache
        pg19=f"--pg19-local {shlex.quote(str(local_sources(C)['pg19']))}" if local_sources(C)["pg19"] else "",
        evaluator=(
            f"--evaluator-model {shlex.quote(teacher_dir(POSITION_LOSS_EVALUATOR))}" if POSITION_LOSS_EVALUATOR else ""
        ),
    shell:
        "python workflow_scripts/eval_position_loss.py --params {params.cfg:q} --models {params.models} "
        "--mixture {params.mixture} --tokenizer {params.tokdir} {params.pg19} {params.evaluator} "
        "--out {output.buckets} --summary {output.summary} --threads {threads} > {log} 2>&1"


rule eval_lm_benchmarks:
    """lm-eval of one model: arc, hellaswag, piqa, boolq, winogrande, lambada, wikitext, the six recall tasks,
    RULER 1K-16K (a rerun reuses the lm-eval calls a killed job finished)."""
    input:
        model=lambda wc: f"{LM_BENCHMARK_JOBS[wc.model][0]}/model.safetensors",
        tokenizer=[tokenizer_file(t) for t in TOKENIZERS],
    output:
        R("eval", "lm_benchmarks/{model}.parquet"),
    log:
        LOG("eval", "lm_benchmarks/{model}"),
    benchmark:
        BENCH("eval", "lm_benchmarks/{model}")
    wildcard_constraints:
        model=wildcard_choice(LM_BENCHMARK_JOBS),
    priority: PRIORITY["eval"]
    conda:
        CUDA_ENV
    resources:
        **job_resources("eval_lm_benchmarks", gpus(1)),
    params:
        cfg=lambda wc: heads_position_params("lm_eval"),
        model=lambda wc: LM_BENCHMARK_JOBS[wc.model][0],
        tokdir=lambda wc: LM_BENCHMARK_JOBS[wc.model][1],
        work=R("eval", "runs/lm_benchmarks"),
    shell:
        "python workflow_scripts/eval_lm_benchmarks.py --params {params.cfg:q} --models {params.model} "
        "--tokenizer {params.tokdir} --work {params.work} --out {output} > {log} 2>&1"


rule lm_benchmarks_table:
    """The lm-eval table of every model, gathered from the per-model jobs."""
    input:
        [R("eval", f"lm_benchmarks/{slug}.parquet") for slug in LM_BENCHMARK_JOBS],
    output:
        R("eval", "lm_benchmarks.parquet"),
    log:
        LOG("eval", "lm_benchmarks"),
    priority: PRIORITY["eval"]
    conda:
        CPU_ENV
    resources:
        **job_resources("lm_benchmarks_table"),
    params:
        cfg=as_json({"models": [d for d, _ in LM_BENCHMARK_JOBS.values()]}),
    shell:
        "python workflow_scripts/gather_eval.py lm_benchmarks --params {params.cfg:q} --inputs {input} "
        "--out {output} > {log} 2>&1"


rule eval_layer_importance:
    """Layer importance of one teacher x mixer: the KL to the teacher when one layer's attention is replaced by its
    stage-1 mixer, and that mixer's alignment residual, per language, on parallel sentences the held-out rows
    do not use (hybridlab.eval.layer_importance); the searched placements' conversions read it."""
    input:
        teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
        student=[
            R("train", f"distill/seed{ANALYSIS_SEED}/{{teacher}}/{ALL_MIXERS}-{{mixer}}/stage1/{f}")
            for f in DISTILL_FILES
        ],
        parallel=CORPUS["parallel"],
        tokenizer=lambda wc: tokenizer_file(teacher_tok(wc.teacher)),
    output:
        scores=R("eval", "layer_importance/{teacher}/{mixer}.parquet"),
        rows=R("eval", "layer_importance/{teacher}/{mixer}_rows.parquet"),
    log:
        LOG("eval", "layer_importance_{teacher}_{mixer}"),
    benchmark:
        BENCH("eval", "layer_importance_{teacher}_{mixer}")
    wildcard_constraints:
        mixer="gdn|kda|gla",
    priority: PRIORITY["importance"]
    conda:
        CUDA_ENV
    threads: TRAIN_THREADS
    resources:
        **job_resources("eval_layer_importance", gpus(1)),
    params:
        cfg=lambda wc: layer_importance_params(wc.teacher, wc.mixer),
        teacher=input_dir("teacher"),
        student=input_dir("student"),
        tokdir=lambda wc: tokenizer_dir(teacher_tok(wc.teacher)),
    shell:
        "python workflow_scripts/eval_layer_importance.py --params {params.cfg:q} --teacher {params.teacher} "
        "--student {params.student} --tokenizer {params.tokdir} --parallel {input.parallel} "
        "--out {output.scores} --rows {output.rows} > {log} 2>&1"


rule layer_importance_table:
    """Every teacher x mixer's layer importance scores in one table (the heat map and the findings read it)."""
    input:
        [importance_table(t, m) for t, m in IMPORTANCE_RUNS],
    output:
        R("eval", "layer_importance.parquet"),
    log:
        LOG("eval", "layer_importance"),
    priority: PRIORITY["eval"]
    conda:
        CPU_ENV
    threads: 1
    resources:
        **job_resources("layer_importance_table"),
    params:
        cfg=as_json({"models": [f"{t}/{m}" for t, m in IMPORTANCE_RUNS]}),
    shell:
        "python workflow_scripts/gather_eval.py layer_importance --params {params.cfg:q} --inputs {input} "
        "--out {output} > {log} 2>&1"


rule eval:
    """Phase target: every analysis table."""
    input:
        [R("eval", f"{name}.parquet") for name in EVAL_TABLES],
        [R("eval", f"softcka_seed{s}.parquet") for s in SOFTCKA_SEEDS],
        [R("eval", "lm_benchmarks.parquet")] if PAPER_PATH else [],
