# The workflow's Python: the validated config, output paths, resources and the params of every phase.
# The phase files (data, models, train, eval, figures .smk) hold their rules only; what they call is here,
# in sections in the same phase order.

import dataclasses
import json
import os
import shlex
import sys

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from hybridlab.config import config_hash, experiment_seeds, placement_seeds, resolve, studies, validate
from hybridlab.config_spec import DISTILL_JOBS
from hybridlab.data.local_sources import DATASET_KEYS as LOCAL_DATASET_KEYS, check_paths, job_environment, local_sources
from hybridlab.data.tokenizer import teacher_key, teacher_name
from hybridlab.build_lock import clear_stale_lock, forget_owner, record_owner
from hybridlab.errors import HybridlabError
from hybridlab.eval.pairs import model_slug
from hybridlab.models.placements import ALL_MIXERS, searched_group
from hybridlab.plots import registry as _registry
from hybridlab.train.arms import sr_arm_specs, sr_score_points
from hybridlab.train.config import stage_tokens

try:
    validate(config)
except HybridlabError as _exc:
    # One line, no traceback: Snakemake would otherwise wrap it in a parse-error report.
    print(f"error: {_exc}", file=sys.stderr)
    sys.exit(1)

C = resolve(config)
SCALE = C["scale"]
try:
    check_paths(C)  # the active preset's local_sources exist (one line now, not a failed corpus job later)
except HybridlabError as _exc:
    print(f"error: {_exc}", file=sys.stderr)
    sys.exit(1)
# Hash of the whole resolved preset: shown in every report caption and recorded with every figure.
CONFIG_HASH = config_hash(C)
DATA = C["data"]
OFFLINE = DATA["source"] == "offline"
ON_GPU = SCALE == "paper"
# The paper preset's code paths (hub data and models, multi-process training, lm-eval). The rehearsal
# preset runs them on CPU at miniature size: only numbers and paths differ.
PAPER_PATH = SCALE in ("paper", "rehearsal")
# The studies whose jobs this preset runs (the real preset runs the multilinguality study alone).
STUDIES = studies(C)
BLD_STUDY = "bld" in STUDIES
REHEARSAL_PROCESSES = 2  # CPU processes (gloo) a multi-GPU rule gets at the rehearsal preset
# Downloaded registry packages (offline corpus) live outside results/ and are reused across presets.
CACHE_DIR = os.environ.get("HYBRIDLAB_CACHE", "cache")


def R(phase, path=""):
    """Output path of a phase at the active scale: results/<phase>/<scale>/<path>."""
    return f"results/{phase}/{SCALE}/{path}".rstrip("/")


def LOG(phase, name):
    return f"results/{phase}/{SCALE}/logs/{name}.log"


def BENCH(phase, name):
    return f"results/{phase}/{SCALE}/benchmarks/{name}.tsv"


def as_json(obj):
    """Rule params as one JSON string; Snakemake reruns a rule when its params change."""
    return json.dumps(obj, sort_keys=True)


def _first(files):
    return files if isinstance(files, str) else files[0]


def input_dir(key):
    """A params function: the directory of input `key` (its first file), for scripts that take a directory.

    The files themselves are the rule's inputs, so the DAG sees them; only the script's argument is a directory.
    """
    return lambda wc, input: os.path.dirname(_first(input[key]))


def output_dir(key=0):
    """A params function: the directory of output `key` (its first file)."""
    return lambda wc, output: os.path.dirname(_first(output[key]))


# Memory plan (hybridlab.pipeline.cluster.plan, `hybridlab plan`): at the paper preset every job's estimated peak per
# GPU is checked here, before anything is submitted; GPU memory from HYBRIDLAB_GPU_MEM_GB (default 80).
GPU_MEM_GB = float(os.environ.get("HYBRIDLAB_GPU_MEM_GB", "80"))


def _memory_plan():
    if not ON_GPU:
        return []
    from hybridlab.pipeline.cluster.plan import plan_preset, refuse_unfit

    try:
        plans = plan_preset(config, gpu_mem_gb=GPU_MEM_GB)
        refuse_unfit(plans, GPU_MEM_GB)
    except HybridlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    return plans


MEMORY_PLAN = _memory_plan()


def gpus(job, at_least=1):
    """GPUs a rule asks for at the paper preset (none on the CPU presets).

    `job` is a plan job-name prefix (e.g. "distill_stage2"): the request is the smallest GPU count the plan
    fits it in, but at least `at_least` (the count the preset's batch settings assume); an int is a fixed count.
    """
    if not ON_GPU:
        return 0
    if isinstance(job, int):
        return job
    from hybridlab.pipeline.cluster.plan import gpus_for

    return max(at_least, gpus_for(MEMORY_PLAN, job, GPU_MEM_GB))


# Host memory, disk, time limit and node placement of every rule's jobs, from hybridlab.pipeline.cluster.resources (also
# printed by `hybridlab plan`): derived from the model shapes, budgets and document counts at the paper preset,
# fixed allowances elsewhere.
# presets.<scale>.cluster: GPUs per node; a job needing more is refused here unless multi_node is set.
def _rule_resources():
    from hybridlab.pipeline.cluster.resources import cluster_settings, rule_resources

    try:
        return rule_resources(config, MEMORY_PLAN if ON_GPU else None), cluster_settings(C)
    except HybridlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


RESOURCES, CLUSTER = _rule_resources()


def _placement(rule, n_gpu):
    from hybridlab.pipeline.cluster.resources import placement

    try:
        return placement(rule, n_gpu, CLUSTER, SCALE)
    except HybridlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


def job_resources(rule, n_gpu=0, model=None):
    """The resources of `rule`'s jobs - mem_mb, disk_mb, runtime, gpu and one node (`nodes=1`, so SLURM never spreads a
    multi-GPU job over nodes). A job needing more GPUs than a node has runs on whole nodes when
    cluster.multi_node is set: per-node GPUs as gres, one srun task per node (`mpi`: the jobstep runs the
    rule's command itself, whose launcher calls srun), memory per node. `model(wildcards)` names the published
    model one job loads, or None for a model of the DAG; it sizes that job's mem_mb."""
    r = RESOURCES[rule]
    out = {"mem_mb": r.mem_mb, "disk_mb": r.disk_mb, "runtime": r.runtime, "gpu": n_gpu, "nodes": 1}
    if model is not None and r.by_model:
        out["mem_mb"] = lambda wc: r.mem_mb_for(model(wc))
    place = _placement(rule, n_gpu)
    if place.nodes > 1:
        out.update(
            mem_mb=-(-r.mem_mb // place.nodes),
            gpu=0,
            gres=f"gpu:{place.gpus_per_node}",
            nodes=place.nodes,
            tasks=place.nodes,
            tasks_per_gpu=0,
            mpi="srun",
        )
    return out


CPU_ENV = "../envs/cpu.yaml"
CUDA_ENV = "../envs/cuda.yaml" if ON_GPU else "../envs/cpu.yaml"


def launcher(n_gpu, at_least=1, rule=None):
    """How a training script starts: plain python on CPU or one GPU, torchrun for several (FSDP2), and
    srun + torchrun (c10d rendezvous) over whole nodes for a job larger than a node (cluster.multi_node).

    At the rehearsal preset a rule that runs on several GPUs at paper (`at_least` > 1) runs on
    REHEARSAL_PROCESSES CPU processes, so the multi-process path is exercised without a GPU.
    """
    from hybridlab.pipeline.cluster.launch import launch_prefix, srun_prefix

    n = REHEARSAL_PROCESSES if SCALE == "rehearsal" and at_least > 1 else max(1, n_gpu)
    place = _placement(rule or "a training job", n_gpu) if ON_GPU else None
    if place is not None and place.nodes > 1:
        return srun_prefix(place.nodes, place.gpus_per_node, port=CLUSTER["rdzv_port"])
    return launch_prefix(n)


# On CPU each training job gets one thread and Snakemake runs jobs side by side: measured on 2 cores,
# small models gain little from a second thread and two threaded jobs fight for the CPUs. GPU jobs
# (paper preset) get 8 CPU threads for data loading and the optimizer.
TRAIN_THREADS = 8 if ON_GPU else 1

# Scheduling order when more jobs are ready than cores (Snakemake runs the highest priority first). Without it
# the local scheduler started the 24 BLD-SR arms before the tokenizer, so the teacher, the longest single job
# and the head of the whole distillation chain, started only after all of them. Data, then the teacher, then
# the Spaced Retrieval runs and their one retrieval-score job (which overlaps with distillation), then
# distillation, the layer importance pass first (every searched placement waits for it); the per-study evaluations and the figures fill the end, the longest evaluation (SoftCKA, every model x
# language x layer) first among them: it was the last job of the tiny build, running alone for 80 s.
PRIORITY = {
    "data": 100,
    "teacher": 90,
    "sr_eval": 60,
    "bld_sr": 50,
    "bld_nl": 45,
    "nl_eval": 40,
    "importance": 35,
    "distill": 30,
    "softcka": 25,
    "eval": 20,
    "figures": 10,
}


# ----------------------------------------------------------------------------------------------------
# Data phase: paths and params of rules/data.smk

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
MIXTURES = [(t, "multilingual") for t in TOK_PLAN["multilingual"]]
MIXTURES += [(t, "english") for t in TOK_PLAN["english"]] if BLD_STUDY else []  # BLD-NL's
SR_SPLITS = ["train", "val", "test"]


# Every job of the preset gets HF_HOME / HF_HUB_OFFLINE / the model-directory map of `local_sources`
# (set here, at parse time, so local jobs and cluster jobs, which re-parse the Snakefile, inherit it).
os.environ.update(job_environment(C))


def corpus_params():
    """Parameters of the corpus step: OfflineCorpusConfig fields offline, loader options for the hub."""
    if OFFLINE:
        keys = [
            "parallel_languages",
            "mono_languages",
            "max_parallel_sentences",
            "min_parallel_sentences",
            "max_mono_docs_per_language",
            "sentences_per_doc",
            "english_bible_docs",
        ]
        p = {k: DATA[k] for k in keys if k in DATA}
        p.update(seed=C["seed"], packages=C["offline"]["packages"], min_english_words=C["offline"]["min_english_words"])
    else:
        keys = [
            "parallel_languages",
            "mono_languages",
            "flores_split",
            "fineweb2_docs_per_language",
            "english_web",
            "english_web_docs",
        ]
        p = {k: DATA[k] for k in keys if k in DATA}
        # local copies in the hub layouts (config `local_sources`; None = the hub or the HF cache)
        src = local_sources(C)
        p.update(english=C["languages"]["english"], local_sources={k: src[k] for k in LOCAL_DATASET_KEYS})
        if "ntrex_sentences_per_doc" in DATA:
            p["ntrex_sentences_per_doc"] = DATA["ntrex_sentences_per_doc"]
    return as_json(p)


def mixture_params(name):
    block_rows = 1
    if name == "multilingual":
        langs, share = DATA["mono_languages"], DATA["english_share"]
    else:  # English-only text for BLD natural-language pre-training (DCLM at paper scale)
        langs, share = [], 1.0
        # A BLD-NL sequence joins context_len / seq_len consecutive rows: keep them together when shuffling.
        ctx = C.get("train", {}).get("bld_nl", {}).get("context_len", DATA["seq_len"])
        block_rows = ctx // DATA["seq_len"] if ctx % DATA["seq_len"] == 0 else 1
    p = {
        "languages": langs,
        "english": C["languages"]["english"],
        "english_share": share,
        "seq_len": DATA["seq_len"],
        "total_tokens": DATA["mixture_tokens"],
        "block_rows": block_rows,
        "val_fraction": DATA["val_fraction"],
        "seed": C["seed"],
    }
    if name == "multilingual" and DATA.get("heldout"):
        p["heldout"] = DATA["heldout"]
    if name == "english" and DATA.get("bld_nl_stream"):
        # Sized to the budget: stream the web source until the largest BLD-NL arm's tokens are packed.
        bld = C["train"]["bld_nl"]
        src = DATA["bld_nl_stream"]["source"]
        p.update(
            stream={**DATA["bld_nl_stream"], "path": local_sources(C)[src]},  # local copy, else the hub
            bld_nl={
                "sizes": bld["sizes"],
                "experiment": C["experiments"]["bld_nl"],
                "run": {k: v for k, v in bld.items() if k != "sizes"},
            },
        )
    return as_json(p)


# ----------------------------------------------------------------------------------------------------
# Models phase: paths and params of rules/models.smk

if OFFLINE:
    TEACHERS = ["teacher"]
else:
    TEACHERS = [teacher_key(name) for name in C["models"]["teachers"]]
PLACEMENTS = C["experiments"]["distill"]["placements"]
MIXERS = C["experiments"]["distill"]["mixers"]
MODEL_FILES = ["config.json", "model.safetensors"]


def teacher_dir(teacher):
    return R("models", f"teachers/{teacher}")


# Replicate seeds per experiment (experiments.<name>.seeds): every arm runs once per seed, one job each, under
# a seed<N> directory placed before the arm so that an arm directory's basename stays the arm's name.
DISTILL_SEEDS = experiment_seeds(C, "distill")
SR_SEEDS = experiment_seeds(C, "bld_sr")
NL_SEEDS = experiment_seeds(C, "bld_nl")
SEED_RE = "[0-9]+"


def student_dir(teacher, placement, mixer, seed):
    return R("models", f"students/seed{seed}/{teacher}/{placement}-{mixer}")


# Searched placements (searched, searched_<group>) take their FA layers from the layer importance of their
# teacher x mixer: one all_mixers student (every layer converted) of the first replicate seed, its stage-1 run,
# then eval_layer_importance swaps its mixers in one layer at a time.
SEARCHED_PLACEMENTS = [p for p in PLACEMENTS if searched_group(p) is not None]
IMPORTANCE_RUNS = [(t, m) for t in TEACHERS for m in MIXERS] if SEARCHED_PLACEMENTS else []


def importance_table(teacher, mixer):
    return R("eval", f"layer_importance/{teacher}/{mixer}.parquet")


def convert_importance(wc):
    """A searched placement's conversion reads its teacher x mixer's importance table."""
    return [importance_table(wc.teacher, wc.mixer)] if searched_group(wc.placement) is not None else []


STUDENTS = [(t, p, m) for t in TEACHERS for p in PLACEMENTS for m in MIXERS]
# Every distillation run: a student x its placement's replicate seeds (experiments.distill.placement_seeds).
DISTILL_RUNS = [(t, p, m, s) for t, p, m in STUDENTS for s in placement_seeds(C, p)]
# Teachers converted from a GGUF file (models.gguf: teacher name -> file spec), by teacher key.
GGUF_TEACHERS = {teacher_key(n): spec for n, spec in (C["models"].get("gguf") or {}).items()}


def _check_gguf_files():
    """A GGUF teacher's file must exist before anything runs (one line at `snakemake -n`, not a failed job)."""
    from hybridlab.models.gguf import resolve_gguf

    for spec in GGUF_TEACHERS.values():
        try:
            resolve_gguf(spec)
        except HybridlabError as exc:
            print(f"error: config: presets.{SCALE}.models.gguf: {exc}", file=sys.stderr)
            sys.exit(1)


_check_gguf_files()
# tokenizer name -> the GGUF teacher whose converted directory holds it
GGUF_TOKENIZERS = {teacher_tok(t): t for t in GGUF_TEACHERS}


def teacher_script(teacher):
    """The teacher job's script: pre-training here (offline), conversion from GGUF, or the hub fetch."""
    if OFFLINE:
        return "pretrain_teacher.py"
    return "convert_gguf_teacher.py" if teacher in GGUF_TEACHERS else "fetch_teacher.py"


# ----------------------------------------------------------------------------------------------------
# Train phase: paths and params of rules/train.smk

# Arms of the Spaced Retrieval study (name -> spec for train_bld_sr.py; hybridlab.train.spaced_retrieval).
BLD_SR_ARMS = sr_arm_specs(C["experiments"]["bld_sr"]) if BLD_STUDY else {}
# Score checkpoints every arm saves: the configured ones and the end of every arm's freeze windows.
SR_SCORE_POINTS = (
    dict(zip(("score_fractions", "score_updates"), sr_score_points(C["experiments"]["bld_sr"]))) if BLD_STUDY else {}
)


def bld_sr_arms():
    """Arm names of the Spaced Retrieval study, derived from experiments.bld_sr."""
    return list(BLD_SR_ARMS)


def bld_sr_arm_regex():
    """Wildcard constraint: exactly the configured arm names (they contain '.' and '+')."""
    import re

    return "|".join(re.escape(a) for a in bld_sr_arms())


def _bld_nl_study():
    """Arms of BLD on natural language, checked once (hybridlab.train.arms): {name: NLArm}."""
    from hybridlab.train.arms import check_study, nl_arms

    exp, run = C["experiments"]["bld_nl"], C.get("train", {}).get("bld_nl")
    if run is None:
        print(
            f"error: config: presets.{SCALE}.train.bld_nl is missing (model sizes and run settings of BLD on "
            "natural language)",
            file=sys.stderr,
        )
        sys.exit(1)
    try:
        check_study(exp, run)
    except HybridlabError as exc:
        print(f"error: config: {exc}", file=sys.stderr)
        sys.exit(1)
    return {a.name: a for a in nl_arms(exp["mixers"], list(run["sizes"]))}


BLD_NL_ARMS = _bld_nl_study() if BLD_STUDY else {}


def bld_nl_arms():
    """Arm names: <mixer>-<baseline|bld>, or <mixer>-<size>-<baseline|bld> with several sizes."""
    return list(BLD_NL_ARMS)


def bld_nl_params(arm, seed):
    a = BLD_NL_ARMS[arm]
    run = {k: v for k, v in C["train"]["bld_nl"].items() if k != "sizes"}
    # `seeds` is not passed: a job sees only its own replicate seed (adding a seed never reruns the others)
    exp = {k: v for k, v in C["experiments"]["bld_nl"].items() if k != "seeds"}
    return as_json(
        {
            "arm": {"name": a.name, "mixer": a.mixer, "size": a.size, "variant": a.variant},
            "shape": C["train"]["bld_nl"]["sizes"][a.size],
            "run": run,
            "experiment": exp,
            "seed": int(seed),
            **DOCUMENT_MASK,
        }
    )


def distill_dir(teacher, placement, mixer, stage, seed):
    return R("train", f"distill/seed{seed}/{teacher}/{placement}-{mixer}/{stage}")


def bld_sr_dir(arm, seed):
    return R("train", f"bld_sr/seed{seed}/{arm}")


def bld_nl_dir(arm, seed):
    return R("train", f"bld_nl/seed{seed}/{arm}")


TRAIN_FILES = ["model.safetensors", "metrics.parquet"]


# Distillation outputs: save_hybrid layout + the stage's metrics (step-0 row = before the first update).
DISTILL_FILES = ["config.json", "model.safetensors", "hybrid.json", "metrics.parquet", "summary.json"]
# experiments.distill.stage1: shared (one stage 1 per teacher x mixer x seed with every layer converted, each
# placement's stage-1 student assembled from it) or per_placement (one stage 1 per student).
SHARED_STAGE1 = C["experiments"]["distill"].get("stage1", "shared") == "shared"
# the placements whose stage 1 the distill_stage1 rule trains
STAGE1_TRAINED = ALL_MIXERS if SHARED_STAGE1 else "|".join(PLACEMENTS)


def distill_params(stage, seed):
    """The distill_train settings one stage uses, its job section's fields (so editing stage 2's knobs never reruns
    stage 1); `seed` is the replicate's (data order; the same for every placement of that seed)."""
    d = C["train"]["distill"]
    keys = [f.name for f in dataclasses.fields(DISTILL_JOBS[stage]) if f.name in d]
    return as_json({**{k: d[k] for k in keys}, "seed": int(seed), **DOCUMENT_MASK})


# ----------------------------------------------------------------------------------------------------
# Eval phase: paths and params of rules/eval.smk

EVAL_TABLES = [
    "softcka",
    "recency",
    "fertility",
    "perplexity",
    "niah",
]
# The BLD study's analyses
EVAL_TABLES += ["retrieval_score", "retrieval_heads", "position_loss"] if BLD_STUDY else []
EVAL_TABLES += ["layer_importance"] if SEARCHED_PLACEMENTS else []


def distilled_students(seeds=None):
    """Final (stage-2) student directories (save_hybrid layout: config.json, model.safetensors, hybrid.json) of
    every student x replicate seed (`seeds`, default experiments.distill.seeds)."""
    return [distill_dir(t, p, m, "stage2", s) for t, p, m, s in DISTILL_RUNS if seeds is None or s in seeds]


# The analyses of the multilinguality study (SoftCKA, recency, NIAH; lm-eval) and the BLD-NL retrieval-head and
# position-loss analyses read the models of the FIRST replicate seed only (their cost grows with every model;
# their intervals are bootstraps / Wilson intervals over sentences, sequences and examples of that seed). The
# findings' comparisons (perplexity / KL per placement, BLD-SR, BLD-NL held-out CE) use every seed.
ANALYSIS_SEED = DISTILL_SEEDS[0]
NL_ANALYSIS_SEED = NL_SEEDS[0]


def analysis_models_param(seed=None):
    """Which models the SoftCKA / recency / NIAH / fertility rules analyse (hybridlab.eval.pairs); `seed`: a
    further replicate seed's distilled students alone (the placements that have it), no hub pair."""
    A = C.get("eval", {}).get("analysis")
    if A is None:
        print(f"error: config: presets.{SCALE}.eval.analysis is missing; copy it from another preset", file=sys.stderr)
        sys.exit(1)
    distilled = (
        [
            {
                "teacher": teacher_name(t),
                "teacher_path": teacher_dir(t),
                "student": f"{p}-{m}",
                "student_path": distill_dir(t, p, m, "stage2", ANALYSIS_SEED if seed is None else seed),
                "tokenizer": tokenizer_dir(teacher_tok(t)) if OFFLINE else teacher_dir(t),
            }
            for t, p, m in STUDENTS
            if seed is None or seed in placement_seeds(C, p)
        ]
        if A["include_distilled"]
        else []
    )
    return {"distilled": distilled, "hub_pairs": A["hub_pairs"] if seed is None else []}


def layer_importance_params(teacher, mixer):
    """eval.layer_importance plus the run's labels (config validation ensures the section where searched runs)."""
    section = C["eval"]["layer_importance"]
    return as_json(
        {
            **section,
            "teacher": teacher,
            "mixer": mixer,
            "english": C["languages"]["english"],
            "fa_ratio": C["experiments"]["distill"]["fa_ratio"],
            "seed": C["seed"],
        }
    )


def analysis_params(section, seed=None):
    A = C["eval"]["analysis"]
    return as_json(
        {
            "models": analysis_models_param(seed),
            "dtype": A["dtype"],
            "seed": C["seed"],
            "english": C["languages"]["english"],
            section: A[section],
        }
    )


def analysis_inputs(seed=None):
    """The DAG models the analyses read (none when only hub models are analysed); `seed`: a further
    replicate seed's students (see analysis_models_param)."""
    if not C.get("eval", {}).get("analysis", {}).get("include_distilled", False):
        return []
    return [f"{teacher_dir(t)}/{f}" for t in TEACHERS for f in MODEL_FILES] + [
        f"{d}/{f}"
        for d in distilled_students([ANALYSIS_SEED if seed is None else seed])
        for f in ("model.safetensors", "hybrid.json")
    ]


# SoftCKA also reads the distilled students of every further replicate seed (one job per seed, same teacher),
# so its hybrid-vs-dense findings have an interval over seeds; the other analyses read the first seed only.
SOFTCKA_SEEDS = (
    sorted({s for *_, s in DISTILL_RUNS} - {ANALYSIS_SEED})
    if C.get("eval", {}).get("analysis", {}).get("include_distilled", False)
    else []
)


def _analysis_models(seed=None):
    """{slug: AnalysisModel} of the analyses (one eval_niah / eval_softcka_model job each), checked once;
    `seed` as analysis_models_param."""
    from hybridlab.eval.pairs import analysis_models

    try:
        models = analysis_models(**analysis_models_param(seed))
    except HybridlabError as exc:
        print(f"error: config: presets.{SCALE}.eval.analysis: {exc}", file=sys.stderr)
        sys.exit(1)
    return {model_slug(m.name): m for m in models}


NIAH_MODELS = _analysis_models()
_TEACHER_DIRS = {teacher_dir(t) for t in TEACHERS}
# SoftCKA runs one job per (replicate seed, model): the first seed's models (with the hub pairs) and each
# further seed's students; a teacher's values do not depend on the seed, so a further seed's table reuses
# the teacher's first-seed job. Every seed's tables are gathered into softcka[_seed<N>].parquet.
SOFTCKA_ANALYSED = {ANALYSIS_SEED: NIAH_MODELS, **{s: _analysis_models(s) for s in SOFTCKA_SEEDS}}
SOFTCKA_MODELS = {
    seed: {
        slug: m
        for slug, m in models.items()
        if seed == ANALYSIS_SEED or not (m.path in _TEACHER_DIRS and slug in NIAH_MODELS)
    }
    for seed, models in SOFTCKA_ANALYSED.items()
}


def model_params(section, slug, seed=None):
    """Params of one model's job of an analysis `section` (niah, softcka): the pairs that model belongs to
    only (adding a model reruns no other job); `seed` as analysis_models_param."""
    m = (NIAH_MODELS if seed is None else SOFTCKA_MODELS[seed])[slug]
    full = analysis_models_param(seed)
    models = {
        "distilled": [d for d in full["distilled"] if f"{d['teacher']}/{d['student']}" in m.pairs],
        "hub_pairs": [p for p in full["hub_pairs"] if p["name"] in m.pairs],
    }
    A = C["eval"]["analysis"]
    return as_json(
        {
            "models": models,
            "dtype": A["dtype"],
            "seed": C["seed"],
            "english": C["languages"]["english"],
            section: A[section],
        }
    )


def softcka_seed_arg(seed):
    """analysis_models_param's `seed` of a SoftCKA job: None for the first seed (its models include the hub pairs)."""
    seed = int(seed)
    return None if seed == ANALYSIS_SEED else seed


def softcka_model(wc):
    """The AnalysisModel of one eval_softcka_model job."""
    return SOFTCKA_MODELS[int(wc.seed)][wc.model]


def softcka_model_files(seed):
    """The per-model SoftCKA tables one replicate seed's table gathers, in model order (a teacher's from the
    first seed's job)."""
    return [
        R("eval", f"softcka/seed{seed if slug in SOFTCKA_MODELS[seed] else ANALYSIS_SEED}/{slug}.parquet")
        for slug in SOFTCKA_ANALYSED[seed]
    ]


def softcka_gather_params(seed):
    """Params of one seed's SoftCKA gather: its model names and its pairs (a reused teacher table holds rows
    for every first-seed pair; the gather keeps this seed's)."""
    models = SOFTCKA_ANALYSED[seed].values()
    return as_json({"models": [m.name for m in models], "pairs": sorted({p for m in models for p in m.pairs})})


def hub_id(m):
    """The hub id of a published AnalysisModel, None for a model of the DAG (a per-model job's mem_mb)."""
    return m.path if m.hub else None


def model_inputs(m):
    """The DAG files one per-model analysis job of AnalysisModel `m` reads (none for a hub model)."""
    if m.hub:
        return []
    return [f"{m.path}/{f}" for f in (MODEL_FILES if m.path in _TEACHER_DIRS else ("model.safetensors", "hybrid.json"))]


def heads_position_params(section):
    """Params of the retrieval-heads / position-loss / lm-eval rules (presets.<scale>.eval.heads_position)."""
    hp = C.get("eval", {}).get("heads_position")
    if hp is None or section not in hp:
        print(f"error: config: presets.{SCALE}.eval.heads_position.{section} is missing", file=sys.stderr)
        sys.exit(1)
    return as_json(
        {
            section: hp[section],
            "seed": C["seed"],
            "device": "cuda" if ON_GPU else "cpu",
            "dtype": "bfloat16" if PAPER_PATH else "float32",
        }
    )


def bld_nl_dirs():
    """BLD-NL arm directories of the first replicate seed (the retrieval-head, position-loss and lm-eval analyses)."""
    return [bld_nl_dir(a, NL_ANALYSIS_SEED) for a in bld_nl_arms()]


def position_loss_evaluator():
    """The teacher key of LongPPL's external evaluator (`position_loss.evaluator` naming a teacher), or None when
    it names an arm (hybridlab.eval.position_loss.external_evaluator)."""
    from hybridlab.eval.position_loss import external_evaluator

    pl_cfg = C.get("eval", {}).get("heads_position", {}).get("position_loss")
    if not BLD_STUDY or pl_cfg is None:
        return None
    try:
        name = external_evaluator(
            pl_cfg["evaluator"],
            bld_nl_arms(),
            {teacher_name(t): teacher_tok(t) for t in TEACHERS},
            BLD_NL_TOK,
            where=f"presets.{SCALE}.eval.heads_position.position_loss.evaluator",
        )
    except HybridlabError as exc:
        print(f"error: config: {exc}", file=sys.stderr)
        sys.exit(1)
    return teacher_key(name) if name is not None else None


POSITION_LOSS_EVALUATOR = position_loss_evaluator()


# Paper (and rehearsal) preset only: lm-eval benchmarks on the teachers, the distilled students and every BLD-NL arm.
LM_BENCHMARK_MODELS = (
    ([teacher_dir(t) for t in TEACHERS] + distilled_students([ANALYSIS_SEED]) + bld_nl_dirs()) if PAPER_PATH else []
)
# Each model's own tokenizer: a teacher's (saved next to it) for the teacher and its students, BLD-NL's for its arms.
LM_BENCHMARK_TOKENIZERS = (
    (
        [teacher_dir(t) for t in TEACHERS]
        + [teacher_dir(t) for t, p, m in STUDENTS]
        + [tokenizer_dir(BLD_NL_TOK)] * len(bld_nl_dirs())
    )
    if PAPER_PATH
    else []
)


# One lm-eval job per model, by slug (its name in the table, results/<phase>/<scale>/ dropped): its directory
# and its tokenizer (the gather job keeps this order).
LM_BENCHMARK_JOBS = {
    model_slug("/".join(Path(d).parts[3:])): (d, tok) for d, tok in zip(LM_BENCHMARK_MODELS, LM_BENCHMARK_TOKENIZERS)
}


def wildcard_choice(names):
    """Wildcard constraint: exactly `names`."""
    import re

    return "|".join(re.escape(n) for n in names) or "(?!)"


# ----------------------------------------------------------------------------------------------------
# Figures phase: paths and params of rules/figures.smk


def _runs(table, dirs):
    """Per-run training logs of a figure: {"<table>/seed<N>/<run>": <dir>/metrics.parquet}; make_figure.py
    concatenates them (hybridlab.plots.tables.concat_runs: columns `run` and `seed`)."""
    return {f"{table}/seed{seed}/{run}": f"{d}/metrics.parquet" for run, seed, d in dirs}


_EV = lambda name: R("eval", f"{name}.parquet")
_DISTILL_RUNS = _runs(
    "distill", [(f"{t}/{p}-{m}", s, distill_dir(t, p, m, "stage2", s)) for t, p, m, s in DISTILL_RUNS]
)
_DISTILL1_RUNS = _runs(
    "distill_stage1",
    [(f"{t}/{p}-{m}", s, distill_dir(t, p, m, "stage1", s)) for t, p, m, s in DISTILL_RUNS],
)
_SR_RUNS = _runs("bld_sr", [(a, s, bld_sr_dir(a, s)) for a in bld_sr_arms() for s in SR_SEEDS])
_NL_RUNS = _runs("bld_nl", [(a, s, bld_nl_dir(a, s)) for a in bld_nl_arms() for s in NL_SEEDS])

# The figure and table registry is hybridlab.plots.registry (FIGURES, TABLES: name -> drawing function and the
# input tables it reads); the rules derive one job per entry from it, with each input table's files:
# an eval table is one parquet file, a training study (distill, bld_sr, bld_nl) one metrics file per run.
_SOFTCKA_SEED_RUNS = {f"softcka_seeds/seed{s}/all": R("eval", f"softcka_seed{s}.parquet") for s in SOFTCKA_SEEDS}
_INPUT_FILES = {
    "distill": _DISTILL_RUNS,
    "distill_stage1": _DISTILL1_RUNS,
    "bld_sr": _SR_RUNS,
    "bld_nl": _NL_RUNS,
    "softcka_seeds": _SOFTCKA_SEED_RUNS,
}


def _inputs(needs):
    files = {}
    for name in needs:
        files.update(_INPUT_FILES[name] if name in _INPUT_FILES else {name: _EV(name)})
    return files


# lm-eval (and so its table) runs at the paper and rehearsal presets only (rules/eval.smk)
_PAPER_ONLY = {"lm_benchmarks"}
_BLD = (
    "fig_sr_",
    "fig_retrieval_score",
    "fig_bld_nl",
    "fig_position_loss",
    "fig_retrieval_heads",
    "table_bld_nl",
    "table_lm_benchmarks",
    "table_retrieval_score",
    "table_sr_accuracy",
)


# A preset without the BLD study draws none of its figures and tables; the findings table reads what exists.
_BLD_TABLES = {
    "retrieval_score",
    "bld_sr",
    "bld_nl",
    "position_loss_summary",
    "position_loss",
    "retrieval_heads_masking",
}


def _needs(name, needs):
    """The inputs of table `name` this preset builds: an optional input the preset lacks is left out."""
    optional = set(_registry.OPTIONAL_INPUTS.get(name, ()))
    return [
        n
        for n in needs
        if (BLD_STUDY or n not in _BLD_TABLES)
        and (PAPER_PATH or n not in _PAPER_ONLY or n not in optional)
        and (SEARCHED_PLACEMENTS or n != "layer_importance")
    ]


# the layer importance heat map exists where a searched placement is run
FIGURES = {
    name: _inputs(needs)
    for name, (_, needs) in _registry.FIGURES.items()
    if (BLD_STUDY or not name.startswith(_BLD)) and (SEARCHED_PLACEMENTS or "layer_importance" not in needs)
}
TABLES = {
    name: _inputs(_needs(name, needs))
    for name, (_, needs) in _registry.TABLES.items()
    if (PAPER_PATH or not _PAPER_ONLY & set(_needs(name, needs))) and (BLD_STUDY or not name.startswith(_BLD))
}


def _stage_tokens(stage):
    return stage_tokens(C.get("train", {}).get("distill", {}).get(stage, {}), DATA["seq_len"])


# The results page's preamble: what was trained on what, and how far this budget is from the study's.
_HELDOUT_TEXT = (
    f"FLORES-200 {DATA.get('flores_split', 'devtest')} (never trained on)"
    if DATA.get("heldout")
    else "the mixture validation documents"
)
RESULTS_HEADER = (
    f"Teacher(s): {', '.join(C['models'].get('teachers') or ['pre-trained in the DAG'])}. "
    f"Held-out text: {_HELDOUT_TEXT}. "
    f"Each student: {_stage_tokens('stage1'):,} stage-1 and {_stage_tokens('stage2'):,} stage-2 tokens, against "
    "the study's 1B: a different regime, so compare directions and sizes, not values."
)

# The Snakemake report (`snakemake --report`): every figure and table with the caption from
# hybridlab.plots.registry.CAPTIONS, the preset and the config hash (report/caption.rst), by study.
CAPTIONS = _registry.CAPTIONS

_STAMP = {"preset": SCALE, "config_hash": CONFIG_HASH}


def _study(name):
    if name == "table_findings":
        return "Findings (generated)"
    return "Competing learning (BLD)" if name.startswith(_BLD) else "Multilinguality"


def _in_report(path, kind):
    """Mark an output for the report: category = study, caption from CAPTIONS (wildcard `kind`)."""
    return report(
        path,
        caption="../report/caption.rst",
        category=lambda wc: _study(wc[kind]),
        labels=lambda wc: {"name": wc[kind], "preset": SCALE},
    )


def _table_args(tables):
    return [f"{name}={path}" for name, path in tables.items()]
