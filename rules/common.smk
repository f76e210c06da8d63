# Wiring: the phase files (data, models, train, eval, figures .smk) hold their rules; the names they call come
# from hybridlab.pipeline (dag: runs, paths and params; cluster.requests: GPUs, resources, launch line), bound here.

import shlex
import sys

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from hybridlab.build_lock import clear_stale_lock, forget_owner, record_owner
from hybridlab.data.local_sources import local_sources
from hybridlab.data.tokenizer import teacher_name
from hybridlab.errors import HybridlabError
from hybridlab.models.placements import ALL_MIXERS
from hybridlab.pipeline import dag as _dag
from hybridlab.pipeline.cluster.requests import Requests
from hybridlab.pipeline.params import as_json
from hybridlab.plots.registry import CAPTIONS


def _fail(exc):
    # One line, no traceback: Snakemake would otherwise wrap it in a parse-error report.
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(1)


def _one_line(fn):
    """`fn` with a bad setting reported as one line (the rules call it while they are parsed)."""

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HybridlabError as exc:
            _fail(exc)

    return call


# The config is validated and every run enumerated here, before any rule is built.
try:
    D = _dag.Dag(config)
    Q = Requests(config, D.C)
except HybridlabError as _exc:
    _fail(_exc)

# The preset
C, SCALE, DATA, OFFLINE, ON_GPU, PAPER_PATH = D.C, D.scale, D.data, D.offline, D.on_gpu, D.paper_path
BLD_STUDY, CACHE_DIR, CONFIG_HASH = D.bld_study, D.cache_dir, D.config_hash

# Paths and params helpers
R, LOG, BENCH = D.R, D.log, D.bench
input_dir, output_dir, wildcard_choice = _dag.input_dir, _dag.output_dir, _dag.wildcard_choice
MIXTURE_FILES, MODEL_FILES, TRAIN_FILES, DISTILL_FILES = (
    _dag.MIXTURE_FILES,
    _dag.MODEL_FILES,
    _dag.TRAIN_FILES,
    _dag.DISTILL_FILES,
)
SR_SPLITS, SEED_RE, PRIORITY = _dag.SR_SPLITS, _dag.SEED_RE, _dag.PRIORITY

# Cluster requests
gpus, job_resources, launcher = _one_line(Q.gpus), _one_line(Q.job_resources), _one_line(Q.launcher)
CPU_ENV, CUDA_ENV, TRAIN_THREADS = Q.cpu_env, Q.cuda_env, Q.train_threads

# Data phase
CORPUS, TOK_PLAN, TOKENIZERS, BLD_NL_TOK, MIXTURES = D.corpus, D.tok_plan, D.tokenizers, D.bld_nl_tok, D.mixtures
DOCUMENT_MASK = D.document_mask
tokenizer_dir, tokenizer_file, mixture_dir, mixture_files = (
    D.tokenizer_dir,
    D.tokenizer_file,
    D.mixture_dir,
    D.mixture_files,
)
teacher_tok, corpus_params, mixture_params = D.teacher_tok, D.corpus_params, D.mixture_params

# Models phase
TEACHERS, PLACEMENTS, DISTILL_RUNS, IMPORTANCE_RUNS = D.teachers, D.placements, D.distill_runs, D.importance_runs
GGUF_TEACHERS, GGUF_TOKENIZERS = D.gguf_teachers, D.gguf_tokenizers
teacher_dir, student_dir, teacher_script, convert_importance = (
    D.teacher_dir,
    D.student_dir,
    D.teacher_script,
    D.convert_importance,
)

# Train phase
BLD_SR_ARMS, BLD_NL_ARMS, SR_SEEDS, NL_SEEDS, SR_SCORE_POINTS = (
    D.sr_arms,
    D.nl_arms,
    D.sr_seeds,
    D.nl_seeds,
    D.sr_score_points,
)
SHARED_STAGE1, STAGE1_TRAINED, SHARED_STAGE1_RUNS = D.shared_stage1, D.stage1_trained, D.shared_stage1_runs
bld_sr_arms, bld_sr_arm_regex, bld_nl_arms = D.bld_sr_arms, D.bld_sr_arm_regex, D.bld_nl_arms
distill_dir, bld_sr_dir, bld_nl_dir, bld_nl_dirs = D.distill_dir, D.bld_sr_dir, D.bld_nl_dir, D.bld_nl_dirs
distill_params, bld_nl_params, distilled_students = D.distill_params, D.bld_nl_params, D.distilled_students

# Eval phase
EVAL_TABLES, ANALYSIS_SEED, NIAH_MODELS = D.eval_tables, D.analysis_seed, D.niah_models
SOFTCKA_SEEDS, SOFTCKA_MODELS = D.softcka_seeds, D.softcka_models
POSITION_LOSS_EVALUATOR, LM_BENCHMARK_JOBS = D.position_loss_evaluator, D.lm_benchmark_jobs
importance_table, analysis_inputs, model_inputs, hub_id = (
    D.importance_table,
    D.analysis_inputs,
    D.model_inputs,
    D.hub_id,
)
softcka_model, softcka_model_files, softcka_seed_arg = D.softcka_model, D.softcka_model_files, D.softcka_seed_arg
layer_importance_params, analysis_params, model_params = (
    D.layer_importance_params,
    D.analysis_params,
    D.model_params,
)
softcka_gather_params, heads_position_params = D.softcka_gather_params, D.heads_position_params

# Figures phase and the report (`snakemake --report`): every figure and table with its caption
# (hybridlab.plots.registry.CAPTIONS), the preset and the config hash (report/caption.rst), by study.
FIGURES, TABLES, RESULTS_HEADER, _STAMP = D.figures, D.tables, D.results_header, D.stamp
_table_args = D.table_args


def _in_report(path, kind):
    """Mark an output for the report: category = study, caption from CAPTIONS (wildcard `kind`)."""
    return report(
        path,
        caption="../report/caption.rst",
        category=lambda wc: D.study(wc[kind]),
        labels=lambda wc: {"name": wc[kind], "preset": SCALE},
    )
