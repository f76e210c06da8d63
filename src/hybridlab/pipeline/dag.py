"""The workflow's view of one preset: what runs (teachers, students, seeds, arms, analysed models, figures) and
where its outputs go. rules/common.smk builds one `Dag` from Snakemake's config and hands its names to the rules.

Everything is checked here, once, at parse time: a bad value raises HybridlabError (one line at `snakemake -n`),
never a failed job later. Output paths are results/<phase>/<scale>/...; a run of a replicate seed sits under
seed<N>/ before its arm, so an arm directory's basename stays the arm's name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hybridlab.config import config_hash, experiment_seeds, placement_seeds, resolve, studies, validate
from hybridlab.data.local_sources import check_paths, job_environment
from hybridlab.data.tokenizer import teacher_key, teacher_name, tokenizer_plan
from hybridlab.errors import HybridlabError
from hybridlab.eval.pairs import analysis_models, model_slug
from hybridlab.models.placements import ALL_MIXERS, searched_group
from hybridlab.pipeline.params import RuleParams
from hybridlab.plots import registry
from hybridlab.train.arms import check_study, nl_arms, sr_arm_specs, sr_score_points
from hybridlab.train.config import stage_tokens

MIXTURE_FILES = ["tokens.npy", "doc_starts.npy", "doc_offsets.npy", "meta.parquet", "stats.json"]
MODEL_FILES = ["config.json", "model.safetensors"]
TRAIN_FILES = ["model.safetensors", "metrics.parquet"]
# Distillation outputs: save_hybrid layout + the stage's metrics (step-0 row = before the first update).
DISTILL_FILES = ["config.json", "model.safetensors", "hybrid.json", "metrics.parquet", "summary.json"]
SR_SPLITS = ["train", "val", "test"]
SEED_RE = "[0-9]+"

# Scheduling order when more jobs are ready than cores (Snakemake runs the highest priority first). Without it
# the local scheduler started the BLD-SR arms before the tokenizer, so the teacher, the longest single job and
# the head of the whole distillation chain, started only after all of them. Data, then the teacher, then the
# Spaced Retrieval runs and their one retrieval-score job (which overlaps with distillation), then distillation,
# the layer importance pass first (every searched placement waits for it); the per-study evaluations and the
# figures fill the end, the longest evaluation (SoftCKA, every model x language x layer) first among them.
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

# The BLD study's figures and tables (a preset without the study draws none of them) and its eval tables.
BLD_OUTPUTS = (
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
BLD_TABLES = {
    "retrieval_score", "bld_sr", "bld_nl", "position_loss_summary", "position_loss", "retrieval_heads_masking",
}
# lm-eval (and so its table) runs at the paper and rehearsal presets only
PAPER_ONLY_TABLES = {"lm_benchmarks"}


def wildcard_choice(names) -> str:
    """Wildcard constraint: exactly `names` (they may contain '.' and '+')."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


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


class Dag(RuleParams):
    """One preset's runs and paths, from Snakemake's (unresolved) config; each rule's params from RuleParams.

    Sets the job environment of the preset's `local_sources` (HF_HOME, HF_HUB_OFFLINE, the model-directory map)
    in os.environ, so local jobs and cluster jobs (which re-parse the Snakefile) inherit it.
    """

    def __init__(self, config: dict):
        validate(config)
        C = self.C = resolve(config)
        self.scale = C["scale"]
        check_paths(C)  # the preset's local_sources exist (one line now, not a failed corpus job later)
        self.config_hash = config_hash(C)  # shown in every report caption, recorded with every figure
        self.data = C["data"]
        self.offline = self.data["source"] == "offline"
        self.on_gpu = self.scale == "paper"
        # The paper preset's code paths (hub data and models, multi-process training, lm-eval); the rehearsal
        # preset runs them on CPU at miniature size: only numbers and paths differ.
        self.paper_path = self.scale in ("paper", "rehearsal")
        self.studies = studies(C)  # the real preset runs the multilinguality study alone
        self.bld_study = "bld" in self.studies
        # Downloaded registry packages (offline corpus) live outside results/ and are reused across presets.
        self.cache_dir = os.environ.get("HYBRIDLAB_CACHE", "cache")
        self._data_phase()
        os.environ.update(job_environment(C))
        self._models_phase()
        self._train_phase()
        self._eval_phase()
        self._figures_phase()

    # -- paths ------------------------------------------------------------------------------------------------

    def R(self, phase: str, path: str = "") -> str:
        """Output path of a phase at the active scale: results/<phase>/<scale>/<path>."""
        return f"results/{phase}/{self.scale}/{path}".rstrip("/")

    def log(self, phase: str, name: str) -> str:
        return f"results/{phase}/{self.scale}/logs/{name}.log"

    def bench(self, phase: str, name: str) -> str:
        return f"results/{phase}/{self.scale}/benchmarks/{name}.tsv"

    def tokenizer_dir(self, tok):
        return self.R("data", f"tokenizer/{tok}")

    def tokenizer_file(self, tok):
        return f"{self.tokenizer_dir(tok)}/tokenizer.json"

    def mixture_dir(self, tok, name):
        """Packed mixture `name` (multilingual | english) tokenised with tokenizer `tok`."""
        return self.R("data", f"mixture/{tok}/{name}")

    def mixture_files(self, tok, name):
        return [f"{self.mixture_dir(tok, name)}/{f}" for f in MIXTURE_FILES]

    def teacher_dir(self, teacher):
        return self.R("models", f"teachers/{teacher}")

    def student_dir(self, teacher, placement, mixer, seed):
        return self.R("models", f"students/seed{seed}/{teacher}/{placement}-{mixer}")

    def importance_table(self, teacher, mixer):
        return self.R("eval", f"layer_importance/{teacher}/{mixer}.parquet")

    def distill_dir(self, teacher, placement, mixer, stage, seed):
        return self.R("train", f"distill/seed{seed}/{teacher}/{placement}-{mixer}/{stage}")

    def bld_sr_dir(self, arm, seed):
        return self.R("train", f"bld_sr/seed{seed}/{arm}")

    def bld_nl_dir(self, arm, seed):
        return self.R("train", f"bld_nl/seed{seed}/{arm}")

    # -- data phase ---------------------------------------------------------------------------------------------

    def _data_phase(self):
        C = self.C
        self.corpus = {k: self.R("data", f"corpus/{k}.{ext}") for k, ext in
                       (("parallel", "parquet"), ("mono", "parquet"), ("manifest", "json"))}
        # One tokenizer per distinct model vocabulary. sources: {name: hub id / local dir / None (BPE trained
        # here)}; teachers: {teacher: name}; bld_nl: name.
        self.tok_plan = tokenizer_plan(C)
        self.tokenizers = list(self.tok_plan["sources"])
        self.bld_nl_tok = self.tok_plan["bld_nl"]
        # data.packing.document_mask: training and held-out evaluation keep attention and recurrent state inside
        # each packed document (the mixtures' doc_starts.npy). Only a true value enters a job's params, so the
        # default leaves existing runs' params (and their outputs) as they are.
        self.document_mask = {"document_mask": True} if self.data.get("packing", {}).get("document_mask") else {}
        # Every mixture the DAG builds: a multilingual one per teacher tokenizer, an English one for BLD-NL's.
        self.mixtures = [(t, "multilingual") for t in self.tok_plan["multilingual"]]
        self.mixtures += [(t, "english") for t in self.tok_plan["english"]] if self.bld_study else []

    def teacher_tok(self, teacher):
        return self.tok_plan["teachers"][teacher]

    # -- models phase -------------------------------------------------------------------------------------------

    def _models_phase(self):
        C = self.C
        distill = C["experiments"]["distill"]
        self.teachers = ["teacher"] if self.offline else [teacher_key(n) for n in C["models"]["teachers"]]
        self.placements = distill["placements"]
        self.mixers = distill["mixers"]
        # Replicate seeds per experiment (experiments.<name>.seeds): every arm runs once per seed, one job each.
        self.distill_seeds = experiment_seeds(C, "distill")
        self.sr_seeds = experiment_seeds(C, "bld_sr")
        self.nl_seeds = experiment_seeds(C, "bld_nl")
        # Searched placements (searched, searched_<group>) take their FA layers from the layer importance of their
        # teacher x mixer: the shared stage 1 (every layer converted) of the first replicate seed, then
        # eval_layer_importance swaps its mixers in one layer at a time.
        self.searched_placements = [p for p in self.placements if searched_group(p) is not None]
        self.importance_runs = [(t, m) for t in self.teachers for m in self.mixers] if self.searched_placements else []
        self.students = [(t, p, m) for t in self.teachers for p in self.placements for m in self.mixers]
        # Every distillation run: a student x its placement's replicate seeds (experiments.distill.placement_seeds).
        self.distill_runs = [(t, p, m, s) for t, p, m in self.students for s in placement_seeds(C, p)]
        # Teachers converted from a GGUF file (models.gguf: teacher name -> file spec), by teacher key; the file
        # must exist before anything runs.
        self.gguf_teachers = {teacher_key(n): spec for n, spec in (C["models"].get("gguf") or {}).items()}
        self._check_gguf_files()
        # tokenizer name -> the GGUF teacher whose converted directory holds it
        self.gguf_tokenizers = {self.teacher_tok(t): t for t in self.gguf_teachers}

    def _check_gguf_files(self):
        from hybridlab.models.gguf import resolve_gguf

        for spec in self.gguf_teachers.values():
            try:
                resolve_gguf(spec)
            except HybridlabError as exc:
                raise HybridlabError(f"config: presets.{self.scale}.models.gguf: {exc}") from None

    def convert_importance(self, wc):
        """A searched placement's conversion reads its teacher x mixer's importance table."""
        return [self.importance_table(wc.teacher, wc.mixer)] if searched_group(wc.placement) is not None else []

    def teacher_script(self, teacher):
        """The teacher job's script: pre-training here (offline), conversion from GGUF, or the hub fetch."""
        if self.offline:
            return "pretrain_teacher.py"
        return "convert_gguf_teacher.py" if teacher in self.gguf_teachers else "fetch_teacher.py"

    # -- train phase --------------------------------------------------------------------------------------------

    def _train_phase(self):
        C = self.C
        exp = C["experiments"]
        # Arms of the Spaced Retrieval study (name -> spec for train_bld_sr.py; hybridlab.train.spaced_retrieval)
        # and the score checkpoints every arm saves: the configured ones and the end of every freeze window.
        self.sr_arms = sr_arm_specs(exp["bld_sr"]) if self.bld_study else {}
        self.sr_score_points = (
            dict(zip(("score_fractions", "score_updates"), sr_score_points(exp["bld_sr"]))) if self.bld_study else {}
        )
        # Arms of BLD on natural language: {name: NLArm}.
        self.nl_arms = {}
        if self.bld_study:
            run = C.get("train", {}).get("bld_nl")
            if run is None:
                raise HybridlabError(f"config: presets.{self.scale}.train.bld_nl is missing (model sizes and run "
                                     "settings of BLD on natural language)")
            try:
                check_study(exp["bld_nl"], run)
            except HybridlabError as exc:
                raise HybridlabError(f"config: {exc}") from None
            self.nl_arms = {a.name: a for a in nl_arms(exp["bld_nl"]["mixers"], list(run["sizes"]))}
        # experiments.distill.stage1: shared (one stage 1 per teacher x mixer x seed with every layer converted,
        # each placement's stage-1 student assembled from it) or per_placement (one stage 1 per student).
        self.shared_stage1 = exp["distill"].get("stage1", "shared") == "shared"
        # the placements whose stage 1 the distill_stage1 rule trains
        self.stage1_trained = ALL_MIXERS if self.shared_stage1 else "|".join(self.placements)
        # (teacher, mixer, seed) of every shared stage 1 (its all_mixers student); none when stage 1 is per placement
        self.shared_stage1_runs = sorted({(t, m, s) for t, _, m, s in self.distill_runs}) if self.shared_stage1 else []

    def bld_sr_arms(self):
        """Arm names of the Spaced Retrieval study, derived from experiments.bld_sr."""
        return list(self.sr_arms)

    def bld_sr_arm_regex(self):
        """Wildcard constraint: exactly the configured arm names (they contain '.' and '+')."""
        return wildcard_choice(self.sr_arms)

    def bld_nl_arms(self):
        """Arm names: <mixer>-<baseline|bld>, or <mixer>-<size>-<baseline|bld> with several sizes."""
        return list(self.nl_arms)

    def distilled_students(self, seeds=None):
        """Final (stage-2) student directories (save_hybrid layout: config.json, model.safetensors, hybrid.json) of
        every student x replicate seed (`seeds`, default experiments.distill.seeds)."""
        return [self.distill_dir(t, p, m, "stage2", s) for t, p, m, s in self.distill_runs
                if seeds is None or s in seeds]

    # -- eval phase ---------------------------------------------------------------------------------------------

    def _eval_phase(self):
        C = self.C
        self.eval_tables = ["softcka", "recency", "fertility", "perplexity", "niah"]
        self.eval_tables += ["retrieval_score", "retrieval_heads", "position_loss"] if self.bld_study else []
        self.eval_tables += ["layer_importance"] if self.searched_placements else []
        # The analyses of the multilinguality study (SoftCKA, recency, NIAH; lm-eval) and the BLD-NL retrieval-head
        # and position-loss analyses read the models of the FIRST replicate seed only (their cost grows with every
        # model; their intervals are bootstraps / Wilson intervals over sentences, sequences and examples of that
        # seed). The findings' comparisons (perplexity / KL per placement, BLD-SR, BLD-NL held-out CE) use every seed.
        self.analysis_seed = self.distill_seeds[0]
        self.nl_analysis_seed = self.nl_seeds[0]
        self.include_distilled = C.get("eval", {}).get("analysis", {}).get("include_distilled", False)
        self.niah_models = self._analysis_models()
        self.teacher_dirs = {self.teacher_dir(t) for t in self.teachers}
        # SoftCKA also reads the distilled students of every further replicate seed (one job per seed and model,
        # same teacher), so its hybrid-vs-dense findings have an interval over seeds. A teacher's values do not
        # depend on the seed, so a further seed's table reuses the teacher's first-seed job; every seed's tables
        # are gathered into softcka[_seed<N>].parquet.
        self.softcka_seeds = (sorted({s for *_, s in self.distill_runs} - {self.analysis_seed})
                              if self.include_distilled else [])
        self.softcka_analysed = {self.analysis_seed: self.niah_models,
                                 **{s: self._analysis_models(s) for s in self.softcka_seeds}}
        self.softcka_models = {
            seed: {slug: m for slug, m in models.items()
                   if seed == self.analysis_seed or not (m.path in self.teacher_dirs and slug in self.niah_models)}
            for seed, models in self.softcka_analysed.items()
        }
        self.position_loss_evaluator = self._position_loss_evaluator()
        hp = C.get("eval", {}).get("heads_position", {})
        needed = ["retrieval_heads", "position_loss"] if self.bld_study else []
        needed += ["lm_eval"] if self.paper_path else []
        for section in needed:
            if section not in hp:
                raise HybridlabError(f"config: presets.{self.scale}.eval.heads_position.{section} is missing")
        # Paper (and rehearsal) preset only: lm-eval on the teachers, the distilled students and every BLD-NL arm,
        # one job per model by slug (its name in the table, results/<phase>/<scale>/ dropped): its directory and
        # its own tokenizer (a teacher's for the teacher and its students, BLD-NL's for its arms).
        jobs = {}
        if self.paper_path:
            models = ([self.teacher_dir(t) for t in self.teachers] + self.distilled_students([self.analysis_seed])
                      + self.bld_nl_dirs())
            toks = ([self.teacher_dir(t) for t in self.teachers] + [self.teacher_dir(t) for t, p, m in self.students]
                    + [self.tokenizer_dir(self.bld_nl_tok)] * len(self.bld_nl_dirs()))
            jobs = {model_slug("/".join(Path(d).parts[3:])): (d, tok) for d, tok in zip(models, toks)}
        self.lm_benchmark_jobs = jobs

    def analysis_models_param(self, seed=None):
        """Which models the SoftCKA / recency / NIAH / fertility rules analyse (hybridlab.eval.pairs); `seed`: a
        further replicate seed's distilled students alone (the placements that have it), no hub pair."""
        A = self.C.get("eval", {}).get("analysis")
        if A is None:
            raise HybridlabError(f"config: presets.{self.scale}.eval.analysis is missing; copy it from another preset")
        distilled = [
            {
                "teacher": teacher_name(t),
                "teacher_path": self.teacher_dir(t),
                "student": f"{p}-{m}",
                "student_path": self.distill_dir(t, p, m, "stage2", self.analysis_seed if seed is None else seed),
                "tokenizer": self.tokenizer_dir(self.teacher_tok(t)) if self.offline else self.teacher_dir(t),
            }
            for t, p, m in self.students
            if seed is None or seed in placement_seeds(self.C, p)
        ] if A["include_distilled"] else []
        return {"distilled": distilled, "hub_pairs": A["hub_pairs"] if seed is None else []}

    def _analysis_models(self, seed=None):
        """{slug: AnalysisModel} of the analyses (one eval_niah / eval_softcka_model job each)."""
        try:
            models = analysis_models(**self.analysis_models_param(seed))
        except HybridlabError as exc:
            raise HybridlabError(f"config: presets.{self.scale}.eval.analysis: {exc}") from None
        return {model_slug(m.name): m for m in models}

    def analysis_inputs(self, seed=None):
        """The DAG models the analyses read (none when only hub models are analysed); `seed`: a further
        replicate seed's students (see analysis_models_param)."""
        if not self.include_distilled:
            return []
        return [f"{self.teacher_dir(t)}/{f}" for t in self.teachers for f in MODEL_FILES] + [
            f"{d}/{f}"
            for d in self.distilled_students([self.analysis_seed if seed is None else seed])
            for f in ("model.safetensors", "hybrid.json")
        ]

    def softcka_seed_arg(self, seed):
        """analysis_models_param's `seed` of a SoftCKA job: None for the first seed (its models include the hub
        pairs)."""
        seed = int(seed)
        return None if seed == self.analysis_seed else seed

    def softcka_model(self, wc):
        """The AnalysisModel of one eval_softcka_model job."""
        return self.softcka_models[int(wc.seed)][wc.model]

    def softcka_model_files(self, seed):
        """The per-model SoftCKA tables one replicate seed's table gathers, in model order (a teacher's from the
        first seed's job)."""
        return [
            self.R("eval", f"softcka/seed{seed if slug in self.softcka_models[seed] else self.analysis_seed}/"
                           f"{slug}.parquet")
            for slug in self.softcka_analysed[seed]
        ]

    def model_inputs(self, m):
        """The DAG files one per-model analysis job of AnalysisModel `m` reads (none for a hub model)."""
        if m.hub:
            return []
        files = MODEL_FILES if m.path in self.teacher_dirs else ("model.safetensors", "hybrid.json")
        return [f"{m.path}/{f}" for f in files]

    def bld_nl_dirs(self):
        """BLD-NL arm directories of the first replicate seed (the retrieval-head, position-loss and lm-eval
        analyses)."""
        return [self.bld_nl_dir(a, self.nl_analysis_seed) for a in self.nl_arms]

    def _position_loss_evaluator(self):
        """The teacher key of LongPPL's external evaluator (`position_loss.evaluator` naming a teacher), or None
        when it names an arm (hybridlab.eval.position_loss.external_evaluator)."""
        from hybridlab.eval.position_loss import external_evaluator

        pl_cfg = self.C.get("eval", {}).get("heads_position", {}).get("position_loss")
        if not self.bld_study or pl_cfg is None:
            return None
        try:
            name = external_evaluator(
                pl_cfg["evaluator"],
                list(self.nl_arms),
                {teacher_name(t): self.teacher_tok(t) for t in self.teachers},
                self.bld_nl_tok,
                where=f"presets.{self.scale}.eval.heads_position.position_loss.evaluator",
            )
        except HybridlabError as exc:
            raise HybridlabError(f"config: {exc}") from None
        return teacher_key(name) if name is not None else None

    # -- figures phase ------------------------------------------------------------------------------------------

    def _figures_phase(self):
        """The figure and table registry (hybridlab.plots.registry: name -> drawing function and the input tables
        it reads) as this preset's jobs, with each input table's files: an eval table is one parquet file, a
        training study (distill, bld_sr, bld_nl) one metrics file per run."""
        C = self.C

        def runs(table, dirs):
            # {"<table>/seed<N>/<run>": <dir>/metrics.parquet}; make_figure.py concatenates them (columns run, seed)
            return {f"{table}/seed{seed}/{run}": f"{d}/metrics.parquet" for run, seed, d in dirs}

        self._input_files = {
            "distill": runs("distill", [(f"{t}/{p}-{m}", s, self.distill_dir(t, p, m, "stage2", s))
                                        for t, p, m, s in self.distill_runs]),
            "distill_stage1": runs("distill_stage1", [(f"{t}/{p}-{m}", s, self.distill_dir(t, p, m, "stage1", s))
                                                      for t, p, m, s in self.distill_runs]),
            "bld_sr": runs("bld_sr", [(a, s, self.bld_sr_dir(a, s)) for a in self.sr_arms for s in self.sr_seeds]),
            "bld_nl": runs("bld_nl", [(a, s, self.bld_nl_dir(a, s)) for a in self.nl_arms for s in self.nl_seeds]),
            "softcka_seeds": {f"softcka_seeds/seed{s}/all": self.R("eval", f"softcka_seed{s}.parquet")
                              for s in self.softcka_seeds},
        }
        # the layer importance heat map exists where a searched placement is run
        self.figures = {
            name: self._inputs(needs)
            for name, (_, needs) in registry.FIGURES.items()
            if (self.bld_study or not name.startswith(BLD_OUTPUTS))
            and (self.searched_placements or "layer_importance" not in needs)
        }
        self.tables = {
            name: self._inputs(self._needs(name, needs))
            for name, (_, needs) in registry.TABLES.items()
            if (self.paper_path or not PAPER_ONLY_TABLES & set(self._needs(name, needs)))
            and (self.bld_study or not name.startswith(BLD_OUTPUTS))
        }
        self.stamp = {"preset": self.scale, "config_hash": self.config_hash}
        # The results page's preamble: what was trained on what, and how far this budget is from the study's.
        heldout = (f"FLORES-200 {self.data.get('flores_split', 'devtest')} (never trained on)"
                   if self.data.get("heldout") else "the mixture validation documents")
        distill = C.get("train", {}).get("distill", {})
        s1, s2 = (stage_tokens(distill.get(s, {}), self.data["seq_len"]) for s in ("stage1", "stage2"))
        self.results_header = (
            f"Teacher(s): {', '.join(C['models'].get('teachers') or ['pre-trained in the DAG'])}. "
            f"Held-out text: {heldout}. "
            f"Each student: {s1:,} stage-1 and {s2:,} stage-2 tokens, against "
            "the study's 1B: a different regime, so compare directions and sizes, not values."
        )

    def _inputs(self, needs):
        files = {}
        for name in needs:
            files.update(self._input_files.get(name, {name: self.R("eval", f"{name}.parquet")}))
        return files

    def _needs(self, name, needs):
        """The inputs of table `name` this preset builds: an optional input the preset lacks is left out."""
        optional = set(registry.OPTIONAL_INPUTS.get(name, ()))
        return [
            n
            for n in needs
            if (self.bld_study or n not in BLD_TABLES)
            and (self.paper_path or n not in PAPER_ONLY_TABLES or n not in optional)
            and (self.searched_placements or n != "layer_importance")
        ]

    @staticmethod
    def study(name):
        """The report category of figure or table `name`."""
        if name == "table_findings":
            return "Findings (generated)"
        return "Competing learning (BLD)" if name.startswith(BLD_OUTPUTS) else "Multilinguality"

    @staticmethod
    def table_args(tables):
        return [f"{name}={path}" for name, path in tables.items()]
