# Train phase: two-stage distillation of every student, BLD on Spaced Retrieval, BLD on natural language.


def bld_sr_arms():
    """Arm names of the Spaced Retrieval study, derived from experiments.bld_sr."""
    e = C["experiments"]["bld_sr"]
    arms = ["baseline"]
    arms += [f"freeze0-{s:g}" for s in e["freeze_until"]]
    arms += [f"window{s:g}+{w:g}" for s, w in e["freeze_windows"]]
    arms += [f"longgap{f:g}" for f in e["long_gap_fractions"]]
    return arms


def bld_nl_arms():
    return [f"{m}-{arm}" for m in C["experiments"]["bld_nl"]["mixers"] for arm in ("baseline", "bld")]


def distill_dir(teacher, placement, mixer, stage):
    return R("train", f"distill/{teacher}/{placement}-{mixer}/{stage}")


TRAIN_FILES = ["model.safetensors", "metrics.parquet"]


rule distill_stage1:
    """Stage 1: align each mixer's output to the frozen teacher attention output (L2, mixers only)."""
    input:
        student=[R("models", f"students/{{teacher}}/{{placement}}-{{mixer}}/{f}") for f in MODEL_FILES],
        teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
        mixture=[R("data", f"mixture/multilingual/{f}") for f in MIXTURE_FILES],
    output:
        [R("train", f"distill/{{teacher}}/{{placement}}-{{mixer}}/stage1/{f}") for f in TRAIN_FILES],
    log:
        LOG("train", "distill_stage1_{teacher}_{placement}-{mixer}"),
    benchmark:
        BENCH("train", "distill_stage1_{teacher}_{placement}-{mixer}")
    resources:
        mem_mb=16000,
        runtime=60,
        gpu=gpus(4),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} distill_stage1 'stage-1 attention alignment' 4 > {log} 2>&1"


rule distill_stage2:
    """Stage 2: whole student on forward KL(teacher || student) of the logits; held-out curves per language."""
    input:
        stage1=[R("train", f"distill/{{teacher}}/{{placement}}-{{mixer}}/stage1/{f}") for f in TRAIN_FILES],
        teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
        mixture=[R("data", f"mixture/multilingual/{f}") for f in MIXTURE_FILES],
    output:
        [R("train", f"distill/{{teacher}}/{{placement}}-{{mixer}}/stage2/{f}") for f in TRAIN_FILES],
    log:
        LOG("train", "distill_stage2_{teacher}_{placement}-{mixer}"),
    benchmark:
        BENCH("train", "distill_stage2_{teacher}_{placement}-{mixer}")
    resources:
        mem_mb=16000,
        runtime=120,
        gpu=gpus(4),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} distill_stage2 'stage-2 KL distillation' 4 > {log} 2>&1"


rule bld_sr:
    """BLD on Spaced Retrieval: 2 KDA + 2 attention layers, one arm (baseline / freeze / long-gap sweep)."""
    input:
        [R("data", f"spaced_retrieval/{s}.parquet") for s in SR_SPLITS],
    output:
        [R("train", f"bld_sr/{{arm}}/{f}") for f in TRAIN_FILES],
    log:
        LOG("train", "bld_sr_{arm}"),
    benchmark:
        BENCH("train", "bld_sr_{arm}")
    resources:
        mem_mb=8000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} bld_sr 'BLD on Spaced Retrieval' 4 > {log} 2>&1"


rule bld_nl:
    """BLD on natural language: Attention-Mixer-Mixer-Mixer, NoPE, baseline vs frozen-mixer start."""
    input:
        [R("data", f"mixture/english/{f}") for f in MIXTURE_FILES],
    output:
        [R("train", f"bld_nl/{{arm}}/{f}") for f in TRAIN_FILES],
    log:
        LOG("train", "bld_nl_{arm}"),
    benchmark:
        BENCH("train", "bld_nl_{arm}")
    resources:
        mem_mb=16000,
        runtime=120,
        gpu=gpus(4),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} bld_nl 'BLD on natural language' 4 > {log} 2>&1"


rule train:
    """Phase target: every distilled student and every BLD arm."""
    input:
        [f"{distill_dir(t, p, m, 'stage2')}/{f}" for t, p, m in STUDENTS for f in TRAIN_FILES],
        [R("train", f"bld_sr/{a}/{f}") for a in bld_sr_arms() for f in TRAIN_FILES],
        [R("train", f"bld_nl/{a}/{f}") for a in bld_nl_arms() for f in TRAIN_FILES],
