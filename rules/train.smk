# Train phase: two-stage distillation of every student, BLD on Spaced Retrieval, BLD on natural language.


rule distill_stage1:
    """Stage 1: align each mixer's output to the frozen teacher attention output (L2, mixers only); with a shared
    stage 1 this trains only the all_mixers student (every layer converted) of each teacher x mixer x seed."""
    input:
        student=[
            R("models", f"students/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/{f}")
            for f in MODEL_FILES + ["hybrid.json"]
        ],
        teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
        mixture=lambda wc: mixture_files(teacher_tok(wc.teacher), "multilingual"),
    output:
        [R("train", f"distill/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/stage1/{f}") for f in DISTILL_FILES],
    log:
        LOG("train", "distill_stage1_{teacher}_{placement}-{mixer}_seed{seed}"),
    benchmark:
        BENCH("train", "distill_stage1_{teacher}_{placement}-{mixer}_seed{seed}")
    wildcard_constraints:
        placement=STAGE1_TRAINED,
        mixer="gdn|kda|gla",
        seed=SEED_RE,
    priority: PRIORITY["importance" if SHARED_STAGE1 else "distill"]
    conda:
        CUDA_ENV
    threads: TRAIN_THREADS
    resources:
        **job_resources("distill_stage1", gpus("distill_stage1", 4)),
    params:
        cfg=lambda wc: distill_params(1, wc.seed),
        launch=launcher(gpus("distill_stage1", 4), at_least=4, rule="distill_stage1"),
        teacher=input_dir("teacher"),
        student=input_dir("student"),
        mixture=input_dir("mixture"),
        work=lambda wc: R("train", f"runs/distill/seed{wc.seed}/{wc.teacher}/{wc.placement}-{wc.mixer}/stage1"),
        out=lambda wc: distill_dir(wc.teacher, wc.placement, wc.mixer, "stage1", wc.seed),
    shell:
        "{params.launch} workflow_scripts/distill.py --stage 1 --params {params.cfg:q} --teacher {params.teacher} "
        "--student {params.student} --mixture {params.mixture} --work {params.work} --out {params.out} > {log} 2>&1"


if SHARED_STAGE1:

    rule assemble_stage1:
        """A placement's stage-1 student: its converted hybrid with the mixers of the shared stage 1 of its teacher x
        mixer x seed (exactly what its own teacher-forced stage 1 would train); evaluated before and after."""
        input:
            student=[
                R("models", f"students/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/{f}")
                for f in MODEL_FILES + ["hybrid.json"]
            ],
            shared=[
                R("train", f"distill/seed{{seed}}/{{teacher}}/{ALL_MIXERS}-{{mixer}}/stage1/{f}")
                for f in DISTILL_FILES
            ],
            teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
            mixture=lambda wc: mixture_files(teacher_tok(wc.teacher), "multilingual"),
        output:
            [R("train", f"distill/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/stage1/{f}") for f in DISTILL_FILES],
        log:
            LOG("train", "assemble_stage1_{teacher}_{placement}-{mixer}_seed{seed}"),
        benchmark:
            BENCH("train", "assemble_stage1_{teacher}_{placement}-{mixer}_seed{seed}")
        wildcard_constraints:
            placement="|".join(PLACEMENTS),
            mixer="gdn|kda|gla",
            seed=SEED_RE,
        priority: PRIORITY["distill"]
        conda:
            CUDA_ENV
        threads: TRAIN_THREADS
        resources:
            **job_resources("assemble_stage1", gpus(1)),
        params:
            cfg=lambda wc: distill_params(2, wc.seed),
            teacher=input_dir("teacher"),
            student=input_dir("student"),
            shared=input_dir("shared"),
            mixture=input_dir("mixture"),
            out=lambda wc: distill_dir(wc.teacher, wc.placement, wc.mixer, "stage1", wc.seed),
        shell:
            "python workflow_scripts/assemble_stage1.py --params {params.cfg:q} --teacher {params.teacher} "
            "--student {params.student} --shared {params.shared} --mixture {params.mixture} --out {params.out} "
            "> {log} 2>&1"

else:

    use rule distill_stage1 as importance_stage1 with:
        wildcard_constraints:
            placement=ALL_MIXERS,
            mixer="gdn|kda|gla",
            seed=SEED_RE,
        priority: PRIORITY["importance"]


rule distill_stage2:
    """Stage 2: whole student on forward KL(teacher || student) of the logits; held-out curves per language."""
    input:
        stage1=[
            R("train", f"distill/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/stage1/{f}") for f in DISTILL_FILES
        ],
        teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
        mixture=lambda wc: mixture_files(teacher_tok(wc.teacher), "multilingual"),
    output:
        [R("train", f"distill/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/stage2/{f}") for f in DISTILL_FILES],
    log:
        LOG("train", "distill_stage2_{teacher}_{placement}-{mixer}_seed{seed}"),
    benchmark:
        BENCH("train", "distill_stage2_{teacher}_{placement}-{mixer}_seed{seed}")
    wildcard_constraints:
        placement="|".join(PLACEMENTS),
        mixer="gdn|kda|gla",
        seed=SEED_RE,
    priority: PRIORITY["distill"]
    conda:
        CUDA_ENV
    threads: TRAIN_THREADS
    resources:
        **job_resources("distill_stage2", gpus("distill_stage2", 4)),
    params:
        cfg=lambda wc: distill_params(2, wc.seed),
        launch=launcher(gpus("distill_stage2", 4), at_least=4, rule="distill_stage2"),
        teacher=input_dir("teacher"),
        student=input_dir("stage1"),
        mixture=input_dir("mixture"),
        work=lambda wc: R("train", f"runs/distill/seed{wc.seed}/{wc.teacher}/{wc.placement}-{wc.mixer}/stage2"),
        out=lambda wc: distill_dir(wc.teacher, wc.placement, wc.mixer, "stage2", wc.seed),
    shell:
        "{params.launch} workflow_scripts/distill.py --stage 2 --params {params.cfg:q} --teacher {params.teacher} "
        "--student {params.student} --mixture {params.mixture} --work {params.work} --out {params.out} > {log} 2>&1"


rule bld_sr:
    """BLD on Spaced Retrieval: 2 KDA + 2 attention layers, one arm (baseline / freeze / long-gap sweep)."""
    input:
        splits=[R("data", f"spaced_retrieval/{s}.parquet") for s in SR_SPLITS],
    output:
        [
            R("train", f"bld_sr/seed{{seed}}/{{arm}}/{f}")
            for f in TRAIN_FILES + ["summary.json", "score_checkpoints/index.json"]
        ],
    log:
        LOG("train", "bld_sr_{arm}_seed{seed}"),
    benchmark:
        BENCH("train", "bld_sr_{arm}_seed{seed}")
    wildcard_constraints:
        arm=bld_sr_arm_regex(),
        seed=SEED_RE,
    priority: PRIORITY["bld_sr"]
    conda:
        CUDA_ENV
    # One thread per arm on CPU: these tiny models are overhead-bound, so two arms side by side finish
    # far sooner than one arm on two threads.
    threads: 1 if not ON_GPU else TRAIN_THREADS
    resources:
        **job_resources("bld_sr", gpus("bld_sr")),
    params:
        # the replicate seed: initial weights (the same for every arm), batch order, long-gap resampling
        cfg=lambda wc: as_json(
            {
                "arm": BLD_SR_ARMS[wc.arm],
                "train": C["train"]["bld_sr"],
                "seed": int(wc.seed),
                **{k: C["experiments"]["bld_sr"][k] for k in ("mixer", "pattern")},
                **SR_SCORE_POINTS,
            }
        ),
        launch=launcher(gpus("bld_sr"), rule="bld_sr"),
        data=input_dir("splits"),
        work=lambda wc: R("train", f"runs/bld_sr/seed{wc.seed}/{wc.arm}"),
        out=lambda wc: bld_sr_dir(wc.arm, wc.seed),
    shell:
        "{params.launch} workflow_scripts/train_bld_sr.py --params {params.cfg:q} --data {params.data} "
        "--work {params.work} --out {params.out} --threads {threads} > {log} 2>&1"


rule bld_nl:
    """BLD on natural language: Attention-Mixer-Mixer-Mixer, NoPE, baseline vs frozen-mixer start, per size."""
    input:
        mixture=mixture_files(BLD_NL_TOK, "english"),
        tokenizer=tokenizer_file(BLD_NL_TOK),
    output:
        [R("train", f"bld_nl/seed{{seed}}/{{arm}}/{f}") for f in TRAIN_FILES + ["hybrid.json", "summary.json"]],
    log:
        LOG("train", "bld_nl_{arm}_seed{seed}"),
    benchmark:
        BENCH("train", "bld_nl_{arm}_seed{seed}")
    wildcard_constraints:
        arm="|".join(BLD_NL_ARMS),
        seed=SEED_RE,
    priority: PRIORITY["bld_nl"]
    conda:
        CUDA_ENV
    # One thread per arm on CPU (as bld_sr): these small models are overhead-bound, so two arms side by side
    # finish sooner than one arm on two threads.
    threads: 1 if not ON_GPU else TRAIN_THREADS
    resources:
        **job_resources("bld_nl", gpus("bld_nl", 4)),
    params:
        cfg=lambda wc: bld_nl_params(wc.arm, wc.seed),
        launch=launcher(gpus("bld_nl", 4), at_least=4, rule="bld_nl"),
        mixture=input_dir("mixture"),
        tokdir=input_dir("tokenizer"),
        work=lambda wc: R("train", f"runs/bld_nl/seed{wc.seed}/{wc.arm}"),
        out=lambda wc: bld_nl_dir(wc.arm, wc.seed),
    shell:
        "{params.launch} workflow_scripts/train_bld_nl.py --params {params.cfg:q} --mixture {params.mixture} "
        "--tokenizer {params.tokdir} --work {params.work} --out {params.out} --threads {threads} > {log} 2>&1"


rule train:
    """Phase target: every distilled student and every BLD arm."""
    input:
        [f"{distill_dir(t, p, m, 'stage2', s)}/{f}" for t, p, m, s in DISTILL_RUNS for f in TRAIN_FILES],
        [f"{bld_sr_dir(a, s)}/{f}" for a in bld_sr_arms() for s in SR_SEEDS for f in TRAIN_FILES],
        [f"{bld_nl_dir(a, s)}/{f}" for a in bld_nl_arms() for s in NL_SEEDS for f in TRAIN_FILES],
