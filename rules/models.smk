# Models phase: the teachers (pre-trained locally at smoke/tiny, the hub models at paper) and their
# hybrid conversions, one per teacher x placement x mixer.


rule teacher:
    """Dense teacher: pre-trained on the multilingual mixture (smoke/tiny) or fetched from the hub (paper)."""
    input:
        mixture=lambda wc: mixture_files(teacher_tok(wc.teacher), "multilingual") if OFFLINE else [],
        # a GGUF teacher brings its own tokenizer (the tokenizer rule reads it from the converted directory)
        tokenizer=lambda wc: [] if wc.teacher in GGUF_TEACHERS else tokenizer_file(teacher_tok(wc.teacher)),
    output:
        [R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
    log:
        LOG("models", "teacher_{teacher}"),
    benchmark:
        BENCH("models", "teacher_{teacher}")
    priority: PRIORITY["teacher"]
    conda:
        CUDA_ENV
    resources:
        # pre-training (offline presets) needs a GPU; fetching a hub teacher or converting a GGUF file does not
        **job_resources("teacher", gpus(1) if OFFLINE else 0),
    params:
        cfg=lambda wc: as_json(
            {
                "shape": C["models"].get("teacher"),
                "train": C.get("train", {}).get("teacher"),
                "seed": C["seed"],
                "name": teacher_name(wc.teacher),
                **({"gguf": GGUF_TEACHERS[wc.teacher]} if wc.teacher in GGUF_TEACHERS else {}),
                **DOCUMENT_MASK,
            }
        ),
        # pretrain_teacher.py (offline presets), convert_gguf_teacher.py (a GGUF teacher) or fetch_teacher.py
        script=lambda wc: teacher_script(wc.teacher),
        work=lambda wc: R("models", f"runs/teacher_{wc.teacher}"),
        out=lambda wc: teacher_dir(wc.teacher),
        mixture=lambda wc: mixture_dir(teacher_tok(wc.teacher), "multilingual"),
        tokdir=lambda wc: tokenizer_dir(teacher_tok(wc.teacher)),
    shell:
        "python workflow_scripts/{params.script} --params {params.cfg:q} --mixture {params.mixture} "
        "--tokenizer {params.tokdir} --work {params.work} --out {params.out} > {log} 2>&1"


rule convert:
    """Replace the attention of every non-full-attention layer with a mixer that inherits q/k/v/o (a searched
    placement's FA layers come from its layer importance table)."""
    input:
        teacher=[R("models", f"teachers/{{teacher}}/{f}") for f in MODEL_FILES],
        importance=convert_importance,
    output:
        [
            R("models", f"students/seed{{seed}}/{{teacher}}/{{placement}}-{{mixer}}/{f}")
            for f in MODEL_FILES + ["hybrid.json"]
        ],
    log:
        LOG("models", "convert_{teacher}_{placement}-{mixer}_seed{seed}"),
    benchmark:
        BENCH("models", "convert_{teacher}_{placement}-{mixer}_seed{seed}")
    wildcard_constraints:
        placement="|".join(PLACEMENTS),
        mixer="gdn|kda|gla",
        seed=SEED_RE,
    priority: PRIORITY["distill"]
    conda:
        CPU_ENV
    resources:
        **job_resources("convert"),
    params:
        # the replicate seed draws the new mixers' parameters (the same seed for every placement)
        cfg=lambda wc: as_json(
            {
                "placement": wc.placement,
                "mixer": wc.mixer,
                "fa_ratio": C["experiments"]["distill"]["fa_ratio"],
                "seed": int(wc.seed),
                "conv_init": C["experiments"]["distill"].get("conv_init", "identity"),
            }
        ),
        teacher=input_dir("teacher"),
        out=lambda wc: student_dir(wc.teacher, wc.placement, wc.mixer, wc.seed),
        importance=lambda wc, input: f"--importance {input.importance}" if input.importance else "",
    shell:
        "python workflow_scripts/convert_student.py --params {params.cfg:q} --teacher {params.teacher} "
        "--out {params.out} {params.importance} > {log} 2>&1"


# The layer importance pass's student (every layer converted) and its stage 1 (rules/train.smk) start as soon as
# the teacher exists: every searched placement waits for them.
use rule convert as importance_convert with:
    wildcard_constraints:
        placement=ALL_MIXERS,
        mixer="gdn|kda|gla",
        seed=SEED_RE,
    priority: PRIORITY["importance"]


rule models:
    """Phase target: every teacher and every converted student."""
    input:
        [f"{teacher_dir(t)}/{f}" for t in TEACHERS for f in MODEL_FILES],
        [f"{student_dir(t, p, m, s)}/hybrid.json" for t, p, m, s in DISTILL_RUNS],
        # the shared stage 1's student of each teacher x mixer x seed (every layer converted)
        [f"{student_dir(t, ALL_MIXERS, m, s)}/hybrid.json" for t, m, s in SHARED_STAGE1_RUNS],
