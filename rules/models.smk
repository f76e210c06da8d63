# Models phase: the teachers (pre-trained locally at smoke/tiny, the hub models at paper) and their
# hybrid conversions, one per teacher x placement x mixer.

if OFFLINE:
    TEACHERS = ["teacher"]
else:
    TEACHERS = [name.replace("/", "--") for name in C["models"]["teachers"]]
PLACEMENTS = C["experiments"]["distill"]["placements"]
MIXERS = C["experiments"]["distill"]["mixers"]
MODEL_FILES = ["config.json", "model.safetensors"]


def teacher_dir(teacher):
    return R("models", f"teachers/{teacher}")


from hybridlab.config import experiment_seeds

# Replicate seeds per experiment (experiments.<name>.seeds): every arm runs once per seed, one job each, under
# a seed<N> directory placed before the arm so that an arm directory's basename stays the arm's name.
DISTILL_SEEDS = experiment_seeds(C, "distill")
SR_SEEDS = experiment_seeds(C, "bld_sr")
NL_SEEDS = experiment_seeds(C, "bld_nl")
SEED_RE = "[0-9]+"


def student_dir(teacher, placement, mixer, seed):
    return R("models", f"students/seed{seed}/{teacher}/{placement}-{mixer}")


STUDENTS = [(t, p, m) for t in TEACHERS for p in PLACEMENTS for m in MIXERS]


rule teacher:
    """Dense teacher: pre-trained on the multilingual mixture (smoke/tiny) or fetched from the hub (paper)."""
    input:
        mixture=lambda wc: mixture_files(teacher_tok(wc.teacher), "multilingual") if OFFLINE else [],
        tokenizer=lambda wc: tokenizer_file(teacher_tok(wc.teacher)),
    output:
        [R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
    params:
        cfg=lambda wc: as_json({"shape": C["models"].get("teacher"), "train": C.get("train", {}).get("teacher"),
                                "seed": C["seed"], "name": wc.teacher.replace("--", "/"), **DOCUMENT_MASK}),
        script="pretrain_teacher.py" if OFFLINE else "fetch_teacher.py",
        work=lambda wc: R("models", f"runs/teacher_{wc.teacher}"),
        out=lambda wc: teacher_dir(wc.teacher),
        mixture=lambda wc: mixture_dir(teacher_tok(wc.teacher), "multilingual"),
        tokdir=lambda wc: tokenizer_dir(teacher_tok(wc.teacher)),
    log:
        LOG("models", "teacher_{teacher}"),
    benchmark:
        BENCH("models", "teacher_{teacher}")
    resources:
        mem_mb=16000,
        runtime=60 if OFFLINE else 120,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{PY} workflow_scripts/{params.script} --params {params.cfg:q} --mixture {params.mixture} "
        "--tokenizer {params.tokdir} --work {params.work} --out {params.out} > {log} 2>&1"


rule convert:
    """Replace the attention of every non-full-attention layer with a mixer that inherits q/k/v/o."""
    input:
        [R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
    output:
        [R("models", f"students/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/{f}")
         for f in MODEL_FILES + ["hybrid.json"]],
    wildcard_constraints:
        placement="|".join(PLACEMENTS),
        mixer="gdn|kda|gla",
        seed=SEED_RE,
    params:
        # the replicate seed draws the new mixers' parameters (the same seed for every placement)
        cfg=lambda wc: as_json({"placement": wc.placement, "mixer": wc.mixer,
                                "fa_ratio": C["experiments"]["distill"]["fa_ratio"], "seed": int(wc.seed),
                                "conv_init": C["experiments"]["distill"].get("conv_init", "random")}),
        teacher=lambda wc: teacher_dir(wc.teacher),
        out=lambda wc: student_dir(wc.teacher, wc.placement, wc.mixer, wc.seed),
    log:
        LOG("models", "convert_{teacher}_{placement}-{mixer}_seed{seed}"),
    benchmark:
        BENCH("models", "convert_{teacher}_{placement}-{mixer}_seed{seed}")
    resources:
        mem_mb=16000,
        runtime=30,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{PY} workflow_scripts/convert_student.py --params {params.cfg:q} --teacher {params.teacher} "
        "--out {params.out} > {log} 2>&1"


rule models:
    """Phase target: every teacher and every converted student."""
    input:
        [f"{teacher_dir(t)}/{f}" for t in TEACHERS for f in MODEL_FILES],
        [f"{student_dir(t, p, m, s)}/hybrid.json" for t, p, m in STUDENTS for s in DISTILL_SEEDS],
