# Train phase: two-stage distillation of every student, BLD on Spaced Retrieval, BLD on natural language.


def bld_sr_arm_specs():
    """Arms of the Spaced Retrieval study (name -> spec for train_bld_sr.py), from experiments.bld_sr.

    Windows are [start, end] fractions of training; long-gap arms resample the train mix.
    """
    e = C["experiments"]["bld_sr"]
    specs = {"baseline": {"windows": []}}
    specs.update({f"freeze0-{s:g}": {"windows": [[0, s]]} for s in e["freeze_until"]})
    # round(): 0.2 + 0.1 must be 0.3, not 0.30000000000000004 (which could pass 1.0 at the end)
    specs.update({f"window{s:g}+{w:g}": {"windows": [[s, round(s + w, 12)]]} for s, w in e["freeze_windows"]})
    specs.update({f"longgap{f:g}": {"windows": [], "long_gap_fraction": f} for f in e["long_gap_fractions"]})
    common = {"scope": e["freeze_scope"], "optimizer_after_unfreeze": e["optimizer_after_unfreeze"]}
    return {name: {"name": name, **common, **spec} for name, spec in specs.items()}


def bld_sr_arms():
    """Arm names of the Spaced Retrieval study, derived from experiments.bld_sr."""
    return list(bld_sr_arm_specs())


def bld_sr_arm_regex():
    """Wildcard constraint: exactly the configured arm names (they contain '.' and '+')."""
    import re

    return "|".join(re.escape(a) for a in bld_sr_arms())


def _bld_nl_study():
    """Arms of BLD on natural language, checked once (hybridlab.train.bld_nl): {name: NLArm}."""
    from hybridlab.train.bld_nl import check_study, nl_arms

    exp, run = C["experiments"]["bld_nl"], C.get("train", {}).get("bld_nl")
    if run is None:
        print(f"error: config: presets.{SCALE}.train.bld_nl is missing (model sizes and run settings of BLD on "
              "natural language)", file=sys.stderr)
        sys.exit(1)
    try:
        check_study(exp, run)
    except HybridlabError as exc:
        print(f"error: config: {exc}", file=sys.stderr)
        sys.exit(1)
    return {a.name: a for a in nl_arms(exp["mixers"], list(run["sizes"]))}


BLD_NL_ARMS = _bld_nl_study()


def bld_nl_arms():
    """Arm names: <mixer>-<baseline|bld>, or <mixer>-<size>-<baseline|bld> with several sizes."""
    return list(BLD_NL_ARMS)


def bld_nl_params(arm, seed):
    a = BLD_NL_ARMS[arm]
    run = {k: v for k, v in C["train"]["bld_nl"].items() if k != "sizes"}
    # `seeds` is not passed: a job sees only its own replicate seed (adding a seed never reruns the others)
    exp = {k: v for k, v in C["experiments"]["bld_nl"].items() if k != "seeds"}
    return as_json({"arm": {"name": a.name, "mixer": a.mixer, "size": a.size, "variant": a.variant},
                    "shape": C["train"]["bld_nl"]["sizes"][a.size], "run": run,
                    "experiment": exp, "seed": int(seed), **DOCUMENT_MASK})


def distill_dir(teacher, placement, mixer, stage, seed):
    return R("train", f"distill/seed{seed}/{teacher}/{placement}-{mixer}/{stage}")


def bld_sr_dir(arm, seed):
    return R("train", f"bld_sr/seed{seed}/{arm}")


def bld_nl_dir(arm, seed):
    return R("train", f"bld_nl/seed{seed}/{arm}")


TRAIN_FILES = ["model.safetensors", "metrics.parquet"]


# Distillation outputs: save_hybrid layout + the stage's metrics (step-0 row = before the first update).
DISTILL_FILES = ["config.json", "model.safetensors", "hybrid.json", "metrics.parquet", "summary.json"]


def distill_params(stage, seed):
    """The distill_train settings one stage uses (so editing stage 2's knobs never reruns stage 1); `seed` is
    the replicate's (data order; the same for every placement of that seed)."""
    d = C["train"]["distill"]
    own = {1: ["stage1", "stage1_inputs"], 2: ["stage2", "kl_chunk_tokens", "kl_vocab_chunk"]}[stage]
    keys = own + ["eval_every_tokens", "ckpt_every_tokens", "eval_rows_per_language", "eval_batch_size",
                  "gradient_checkpointing"]
    keys += ["teacher_sharding"] if "teacher_sharding" in d else []  # replicate (default) | shard
    return as_json({**{k: d[k] for k in keys}, "seed": int(seed), **DOCUMENT_MASK})


rule distill_stage1:
    """Stage 1: align each mixer's output to the frozen teacher attention output (L2, mixers only)."""
    input:
        student=[R("models", f"students/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/{f}")
                 for f in MODEL_FILES + ["hybrid.json"]],
        teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
        mixture=lambda wc: mixture_files(teacher_tok(wc.teacher), "multilingual"),
    output:
        [R("train", f"distill/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/stage1/{f}") for f in DISTILL_FILES],
    wildcard_constraints:
        placement="|".join(PLACEMENTS),
        mixer="gdn|kda|gla",
        seed=SEED_RE,
    params:
        cfg=lambda wc: distill_params(1, wc.seed),
        launch=launcher(gpus("distill_stage1", 4), at_least=4),
        teacher=lambda wc: teacher_dir(wc.teacher),
        student=lambda wc: student_dir(wc.teacher, wc.placement, wc.mixer, wc.seed),
        mixture=lambda wc: mixture_dir(teacher_tok(wc.teacher), "multilingual"),
        work=lambda wc: R("train", f"runs/distill/seed{wc.seed}/{wc.teacher}/{wc.placement}-{wc.mixer}/stage1"),
        out=lambda wc: distill_dir(wc.teacher, wc.placement, wc.mixer, "stage1", wc.seed),
    threads: TRAIN_THREADS
    log:
        LOG("train", "distill_stage1_{teacher}_{placement}-{mixer}_seed{seed}"),
    benchmark:
        BENCH("train", "distill_stage1_{teacher}_{placement}-{mixer}_seed{seed}")
    resources:
        mem_mb=16000 if OFFLINE else 160000,
        runtime=60 if OFFLINE else 600,
        gpu=gpus("distill_stage1", 4),
    conda:
        CUDA_ENV
    shell:
        "{params.launch} workflow_scripts/distill.py --stage 1 --params {params.cfg:q} --teacher {params.teacher} "
        "--student {params.student} --mixture {params.mixture} --work {params.work} --out {params.out} > {log} 2>&1"


rule distill_stage2:
    """Stage 2: whole student on forward KL(teacher || student) of the logits; held-out curves per language."""
    input:
        stage1=[R("train", f"distill/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/stage1/{f}") for f in DISTILL_FILES],
        teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
        mixture=lambda wc: mixture_files(teacher_tok(wc.teacher), "multilingual"),
    output:
        [R("train", f"distill/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/stage2/{f}") for f in DISTILL_FILES],
    wildcard_constraints:
        placement="|".join(PLACEMENTS),
        mixer="gdn|kda|gla",
        seed=SEED_RE,
    params:
        cfg=lambda wc: distill_params(2, wc.seed),
        launch=launcher(gpus("distill_stage2", 4), at_least=4),
        teacher=lambda wc: teacher_dir(wc.teacher),
        student=lambda wc: distill_dir(wc.teacher, wc.placement, wc.mixer, "stage1", wc.seed),
        mixture=lambda wc: mixture_dir(teacher_tok(wc.teacher), "multilingual"),
        work=lambda wc: R("train", f"runs/distill/seed{wc.seed}/{wc.teacher}/{wc.placement}-{wc.mixer}/stage2"),
        out=lambda wc: distill_dir(wc.teacher, wc.placement, wc.mixer, "stage2", wc.seed),
    threads: TRAIN_THREADS
    log:
        LOG("train", "distill_stage2_{teacher}_{placement}-{mixer}_seed{seed}"),
    benchmark:
        BENCH("train", "distill_stage2_{teacher}_{placement}-{mixer}_seed{seed}")
    resources:
        mem_mb=16000 if OFFLINE else 160000,
        runtime=120 if OFFLINE else 2880,
        gpu=gpus("distill_stage2", 4),
    conda:
        CUDA_ENV
    shell:
        "{params.launch} workflow_scripts/distill.py --stage 2 --params {params.cfg:q} --teacher {params.teacher} "
        "--student {params.student} --mixture {params.mixture} --work {params.work} --out {params.out} > {log} 2>&1"


rule bld_sr:
    """BLD on Spaced Retrieval: 2 KDA + 2 attention layers, one arm (baseline / freeze / long-gap sweep)."""
    input:
        [R("data", f"spaced_retrieval/{s}.parquet") for s in SR_SPLITS],
    output:
        [R("train", f"bld_sr/seed{{seed}}/{{arm}}/{f}")
         for f in TRAIN_FILES + ["summary.json", "score_checkpoints/index.json"]],
    wildcard_constraints:
        arm=bld_sr_arm_regex(),
        seed=SEED_RE,
    params:
        # the replicate seed: initial weights (the same for every arm), batch order, long-gap resampling
        cfg=lambda wc: as_json({"arm": bld_sr_arm_specs()[wc.arm], "train": C["train"]["bld_sr"], "seed": int(wc.seed),
                                **{k: C["experiments"]["bld_sr"][k] for k in ("mixer", "pattern", "score_fractions")}}),
        launch=launcher(gpus("bld_sr")),
        data=R("data", "spaced_retrieval"),
        work=lambda wc: R("train", f"runs/bld_sr/seed{wc.seed}/{wc.arm}"),
        out=lambda wc: bld_sr_dir(wc.arm, wc.seed),
    # One thread per arm on CPU: these tiny models are overhead-bound, so two arms side by side finish
    # far sooner than one arm on two threads.
    threads: 1 if not ON_GPU else TRAIN_THREADS
    log:
        LOG("train", "bld_sr_{arm}_seed{seed}"),
    benchmark:
        BENCH("train", "bld_sr_{arm}_seed{seed}")
    resources:
        mem_mb=4000,
        runtime=60,
        gpu=gpus("bld_sr"),
    conda:
        CUDA_ENV
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
    wildcard_constraints:
        arm="|".join(BLD_NL_ARMS),
        seed=SEED_RE,
    params:
        cfg=lambda wc: bld_nl_params(wc.arm, wc.seed),
        launch=launcher(gpus("bld_nl", 4), at_least=4),
        mixture=mixture_dir(BLD_NL_TOK, "english"),
        tokdir=tokenizer_dir(BLD_NL_TOK),
        work=lambda wc: R("train", f"runs/bld_nl/seed{wc.seed}/{wc.arm}"),
        out=lambda wc: bld_nl_dir(wc.arm, wc.seed),
    log:
        LOG("train", "bld_nl_{arm}_seed{seed}"),
    benchmark:
        BENCH("train", "bld_nl_{arm}_seed{seed}")
    # One thread per arm on CPU (as bld_sr): these small models are overhead-bound, so two arms side by side
    # finish sooner than one arm on two threads.
    threads: 1 if not ON_GPU else TRAIN_THREADS
    resources:
        mem_mb=16000 if OFFLINE else 160000,
        runtime=120 if OFFLINE else 2880,
        gpu=gpus("bld_nl", 4),
    conda:
        CUDA_ENV
    shell:
        "{params.launch} workflow_scripts/train_bld_nl.py --params {params.cfg:q} --mixture {params.mixture} "
        "--tokenizer {params.tokdir} --work {params.work} --out {params.out} --threads {threads} > {log} 2>&1"


rule train:
    """Phase target: every distilled student and every BLD arm."""
    input:
        [f"{distill_dir(t, p, m, 'stage2', s)}/{f}" for t, p, m in STUDENTS for s in DISTILL_SEEDS for f in TRAIN_FILES],
        [f"{bld_sr_dir(a, s)}/{f}" for a in bld_sr_arms() for s in SR_SEEDS for f in TRAIN_FILES],
        [f"{bld_nl_dir(a, s)}/{f}" for a in bld_nl_arms() for s in NL_SEEDS for f in TRAIN_FILES],
