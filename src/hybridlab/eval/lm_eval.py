"""Standard benchmarks through EleutherAI's lm-evaluation-harness (paper preset; a local task for tests).

Runs lm-eval's `HFLM` wrapper around a model that is already loaded (so converted hybrids and the BLD
models, which `AutoModelForCausalLM.from_pretrained` cannot rebuild, are evaluated like any transformers
model). Task sets:

- **Standard**: arc_easy, arc_challenge, hellaswag, piqa, boolq, winogrande, lambada_openai, wikitext.
- **Recall** (the in-context recall suite of the "Based" / "Just read twice" line of work, zero-shot,
  greedy answer cut at the first newline, scored "contains": 1 if a gold answer occurs in the answer,
  case-insensitive). SWDE, FDA and SQuAD are upstream lm-eval tasks (`swde`, `fda`,
  `squad_completion`: hazyresearch/based-swde-v2, hazyresearch/based-fda, hazyresearch/based-squad).
  Upstream lm-eval's `triviaqa`, `nq_open` and `drop` are closed-book, so the in-context variants are
  project task configs in `hybridlab/eval/lm_eval_tasks/` over Hazy Research's evaluation sets on the
  Hugging Face hub (split `validation`, columns context / question / answers): `based_triviaqa`
  (hazyresearch/based_triviaqa, 1.69K rows), `based_drop` (hazyresearch/based_drop) and `based_nq`
  (hazyresearch/based_nq_2048: NQ with its Wikipedia context cut to 2K tokens; 512 and 1024 cuts
  exist as based_nq_512 / based_nq_1024, 3,157 rows each). The prompt is the passage, then the
  question as a cloze prefix (TriviaQA's [PAR]/[DOC]/[TLE] markers removed).
- **RULER** at `ruler_lengths` (lm-eval's 13 `ruler` tasks, `max_seq_lengths` metadata; inputs are
  built with the tokenizer named in `tokenizer_name`, a hub id or a local directory). Every (task,
  length) pair runs, minus `ruler_exclude` ("task@length"). The default grid is 13 tasks x {1K, 2K, 4K,
  8K, 16K} = 65 pairs: the study averages 57 pairs over 1K-16K but does not list which 8 it leaves
  out, so the full grid is used and the summary row says how many pairs it averages.
- **Local** (`hybridlab_local_recall`, `lm_eval_tasks.local`): a tiny key-value recall set written to
  disk in lm-eval's format (`dataset_path: json`), for the rehearsal and tests (no network).

lm-eval is an optional dependency (`pip install "lm-eval[hf,ruler]"`): without it, or when task data
cannot be fetched (offline hub), the run stops with one `HybridlabError` line. Results become tidy rows
(model, task, metric, filter, value, stderr): one per numeric metric of every task; RULER's metrics are
the sequence lengths (metric "4096"). Summary rows: task "ruler" (metric "mean": the mean over every
configured pair; "pairs": how many; "<length>": the mean over tasks at that length) and task "recall" (metric
"mean": the mean "contains" of the six recall tasks, when all six ran).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import tempfile
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import polars as pl

from hybridlab.errors import HybridlabError

STANDARD_TASKS = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "boolq", "winogrande", "lambada_openai",
                  "wikitext")
RECALL_TASKS = ("swde", "fda", "squad_completion", "based_triviaqa", "based_drop", "based_nq")
PROJECT_TASKS = ("based_triviaqa", "based_drop", "based_nq")  # YAMLs in hybridlab/eval/lm_eval_tasks/
LOCAL_TASK = "hybridlab_local_recall"
PAPER_TASKS = STANDARD_TASKS + RECALL_TASKS
RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multiquery", "niah_multivalue", "ruler_vt", "ruler_cwe", "ruler_fwe",
               "ruler_qa_squad", "ruler_qa_hotpot")
RULER_LENGTHS = (1024, 2048, 4096, 8192, 16384)
INSTALL_HINT = 'pip install "lm-eval[hf,ruler]>=0.4.13,<0.5"'
ROW_SCHEMA = {"model": pl.String, "task": pl.String, "metric": pl.String, "filter": pl.String,
              "value": pl.Float64, "stderr": pl.Float64}
_OFFLINE_TYPES = ("OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectionError", "ConnectTimeout",
                  "MaxRetryError", "NameResolutionError")


def _parse_pair(text: str) -> tuple[str, int]:
    task, sep, length = str(text).partition("@")
    if not sep or not task or not length.isdigit():
        raise HybridlabError(f"lm-eval: ruler_exclude entry {text!r} is not 'task@length' (e.g. ruler_qa_hotpot@1024)")
    return task, int(length)


@dataclass(frozen=True)
class LMEvalConfig:
    tasks: tuple[str, ...] = PAPER_TASKS
    ruler_lengths: tuple[int, ...] = RULER_LENGTHS  # empty: no RULER
    ruler_tasks: tuple[str, ...] = RULER_TASKS
    ruler_exclude: tuple[str, ...] = ()  # "task@length" pairs left out of the RULER grid
    num_fewshot: int | None = None  # None: each task's default
    batch_size: int | str = 1
    limit: int | float | None = None  # examples per task (a fraction if < 1); None: all
    max_length: int | None = None  # None: the longest RULER length (or the model's own limit)
    seed: int = 1234
    ruler_samples: int | None = None  # RULER samples per task and length (one call per length); None: lm-eval's 500

    def __post_init__(self) -> None:
        for name in ("tasks", "ruler_lengths", "ruler_tasks", "ruler_exclude"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if any(int(n) < 1 for n in self.ruler_lengths):
            raise HybridlabError(f"lm-eval: RULER lengths must be positive, got {list(self.ruler_lengths)}")
        unknown = sorted(set(self.ruler_tasks) - set(RULER_TASKS))
        if unknown:
            raise HybridlabError(f"lm-eval: unknown RULER task(s) {unknown}; choose from {list(RULER_TASKS)}")
        for task, length in map(_parse_pair, self.ruler_exclude):
            if task not in self.ruler_tasks or length not in self.ruler_lengths:
                raise HybridlabError(f"lm-eval: ruler_exclude entry '{task}@{length}' is not in the RULER grid "
                                     f"(ruler_tasks x ruler_lengths); remove it or fix its name or length")
        if self.ruler_samples is not None and int(self.ruler_samples) < 1:
            raise HybridlabError(f"lm-eval: ruler_samples must be >= 1, got {self.ruler_samples}")
        if not self.tasks and not ruler_pairs(self):
            raise HybridlabError("lm-eval: no tasks and no RULER pairs; give at least one task")


def ruler_pairs(cfg: LMEvalConfig) -> list[tuple[str, int]]:
    """Every (RULER task, length) pair that runs: ruler_tasks x ruler_lengths minus ruler_exclude."""
    if not cfg.ruler_lengths:
        return []
    excluded = set(map(_parse_pair, cfg.ruler_exclude))
    return [(t, n) for t in cfg.ruler_tasks for n in sorted(cfg.ruler_lengths) if (t, n) not in excluded]


def evaluation_runs(cfg: LMEvalConfig, *, tokenizer_name: str) -> list[dict[str, Any]]:
    """One lm-eval call per entry: the plain tasks, then the RULER tasks grouped by their set of lengths
    (lm-eval's `max_seq_lengths` applies to every task of a call). Each: {"tasks": [...], "metadata": {...}}.
    With `ruler_samples`, one RULER call per length with {"limit": ruler_samples} (lm-eval's limit takes a
    call's first samples, so one length per call keeps every length at that count)."""
    runs = [{"tasks": list(cfg.tasks), "metadata": {}}] if cfg.tasks else []
    if cfg.ruler_samples is not None:
        by_length: dict[int, list[str]] = {}
        for task, length in ruler_pairs(cfg):
            by_length.setdefault(length, []).append(task)
        return runs + [{"tasks": tasks, "metadata": {"max_seq_lengths": [n], "tokenizer": tokenizer_name},
                        "limit": int(cfg.ruler_samples)} for n, tasks in sorted(by_length.items())]
    lengths_of: dict[str, tuple[int, ...]] = {}
    for task, length in ruler_pairs(cfg):
        lengths_of[task] = lengths_of.get(task, ()) + (length,)
    by_lengths = sorted(lengths_of.items(), key=lambda kv: kv[1])
    for lengths, group in groupby(by_lengths, key=lambda kv: kv[1]):
        runs.append({"tasks": [t for t, _ in group],
                     "metadata": {"max_seq_lengths": list(lengths), "tokenizer": tokenizer_name}})
    return runs


def build_arguments(cfg: LMEvalConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(HFLM keyword arguments, simple_evaluate keyword arguments shared by every call) for `cfg`."""
    longest = max((n for _, n in ruler_pairs(cfg)), default=None)
    max_length = cfg.max_length or longest
    hflm: dict[str, Any] = {"batch_size": cfg.batch_size}
    if max_length is not None:
        hflm["max_length"] = max_length
    evaluate = {"num_fewshot": cfg.num_fewshot, "batch_size": cfg.batch_size, "limit": cfg.limit,
                "log_samples": False, "random_seed": cfg.seed, "numpy_random_seed": cfg.seed,
                "torch_random_seed": cfg.seed, "fewshot_random_seed": cfg.seed}
    return hflm, evaluate


def require_lm_eval():
    """The `lm_eval` module, or one line saying how to install it."""
    try:
        module = importlib.import_module("lm_eval")
        importlib.import_module("lm_eval.models.huggingface")
        importlib.import_module("lm_eval.tasks")
    except ImportError as exc:
        raise HybridlabError(f"lm-eval is not installed ({exc.name or exc}); {INSTALL_HINT}") from None
    return module


def _offline_cause(exc: BaseException) -> bool:
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).lower()
        if type(e).__name__ in _OFFLINE_TYPES or ("offline" in text and ("hub" in text or "dataset" in text)):
            return True
        e = e.__cause__ or e.__context__
    return False


def _merge(merged: dict[str, dict], results: dict[str, dict]) -> None:
    """Add one call's per-task metrics; RULER's -1 / "N/A" for a length the call had no sample at never
    replaces another call's value."""
    for task, metrics in results.items():
        cur = merged.setdefault(task, {})
        for key, value in metrics.items():
            if key not in cur or not (value is None or value == -1 or value == "N/A"):
                cur[key] = value


def _json_value(o):
    return o.item() if hasattr(o, "item") else str(o)


def run_lm_eval(model, tokenizer, cfg: LMEvalConfig, *, tokenizer_name: str, model_name: str,
                work: str | Path | None = None) -> pl.DataFrame:
    """Evaluate an already-loaded causal LM with lm-eval; tidy rows plus the summary rows (module doc).

    `work`: a directory where each finished lm-eval call's results are kept (`call-<hash>.json`, keyed by its
    tasks, metadata and limit); a rerun reads them instead of evaluating again (the caller keys the directory
    by model and settings)."""
    lm_eval = require_lm_eval()
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from hybridlab.eval.lm_eval_tasks import TASKS_DIR
    from hybridlab.eval.lm_eval_tasks.local import write_local_task

    hflm_kwargs, evaluate_kwargs = build_arguments(cfg)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, **hflm_kwargs)
    merged: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="hybridlab-lm-eval-") as tmp:
        include = [str(TASKS_DIR)]
        if LOCAL_TASK in cfg.tasks:
            include.append(str(write_local_task(tmp)))
        for run in evaluation_runs(cfg, tokenizer_name=tokenizer_name):
            key = hashlib.sha256(json.dumps(run, sort_keys=True).encode()).hexdigest()[:16]
            done = Path(work) / f"call-{key}.json" if work is not None else None
            if done is not None and done.is_file():
                _merge(merged, json.loads(done.read_text()))
                continue
            own = set(PROJECT_TASKS) | {LOCAL_TASK}
            manager = TaskManager(include_path=include, include_defaults=not own.issuperset(run["tasks"]),
                                  metadata=run["metadata"] or None)
            try:
                results = lm_eval.simple_evaluate(model=lm, tasks=run["tasks"], task_manager=manager,
                                                  **{**evaluate_kwargs, **({"limit": run["limit"]} if "limit" in run else {})})
            except Exception as exc:  # lm-eval surfaces dataset download failures as many exception types
                if _offline_cause(exc):
                    raise HybridlabError(
                        f"lm-eval could not fetch its task data for {model_name} (offline or unreachable hub: "
                        f"{type(exc).__name__}); run once online to fill the datasets cache, then retry") from exc
                raise
            if not results or "results" not in results:
                raise HybridlabError(
                    f"lm-eval returned no results for {model_name} (non-zero rank of a multi-process run?)")
            if done is not None:
                from hybridlab.atomic import atomic_file

                with atomic_file(done) as tmp:
                    Path(tmp).write_text(json.dumps(results["results"], default=_json_value))
            _merge(merged, results["results"])
    table = results_table({"results": merged}, model_name)
    return pl.concat([table, summary_rows(table, cfg, model_name)])


def results_table(results: dict, model_name: str) -> pl.DataFrame:
    """One row per numeric `metric,filter` entry of `results["results"]` (stderr joined in, null if N/A).
    RULER reports -1 for a length it generated no sample at (every length it knows of): those are dropped."""
    rows = []
    for task, metrics in sorted(results["results"].items()):
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            if metric.isdigit() and value == -1:
                continue
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            rows.append({"model": model_name, "task": task, "metric": metric, "filter": filt, "value": float(value),
                         "stderr": float(stderr) if isinstance(stderr, (int, float)) else None})
    if not rows:
        raise HybridlabError(f"lm-eval results for {model_name} hold no numeric metric; check the task names")
    return pl.DataFrame(rows, schema=ROW_SCHEMA)


def summary_rows(table: pl.DataFrame, cfg: LMEvalConfig, model_name: str) -> pl.DataFrame:
    """RULER means (over every configured pair, and per length) and the recall mean, as table rows."""
    rows = []
    pairs = ruler_pairs(cfg)
    if pairs:
        got = {(t, int(m)): v for t, m, v in table.filter(pl.col("metric").str.contains(r"^\d+$"))
               .select("task", "metric", "value").rows()}
        missing = [f"{t}@{n}" for t, n in pairs if (t, n) not in got]
        if missing:
            raise HybridlabError(f"lm-eval: {len(missing)} RULER pair(s) missing from the results for {model_name}: "
                                 f"{missing[:4]}; add them to lm_eval.ruler_exclude, or use ruler_samples instead of `limit` "
                                 "(lm-eval cuts RULER's samples in length order, so a small limit leaves the longer "
                                 "lengths empty)")
        values = [got[p] for p in pairs]
        rows.append({"task": "ruler", "metric": "mean", "value": sum(values) / len(values)})
        rows.append({"task": "ruler", "metric": "pairs", "value": float(len(values))})
        for n in sorted({n for _, n in pairs}):
            at = [got[p] for p in pairs if p[1] == n]
            rows.append({"task": "ruler", "metric": str(n), "value": sum(at) / len(at)})
    recall = table.filter(pl.col("task").is_in(list(RECALL_TASKS)) & (pl.col("metric") == "contains"))
    if recall.height and set(recall["task"]) == set(RECALL_TASKS):
        rows.append({"task": "recall", "metric": "mean", "value": float(recall["value"].mean())})
    return pl.DataFrame([{"model": model_name, **r, "filter": "none", "stderr": None} for r in rows],
                        schema=ROW_SCHEMA).select(list(ROW_SCHEMA))


def gather_tables(paths: list[str | Path]) -> pl.DataFrame:
    """The lm_benchmarks table from the per-model tables of the eval_lm_benchmarks jobs, in the given order; a
    table with other columns than ROW_SCHEMA is one line naming it."""
    frames = []
    for path in paths:
        f = pl.read_parquet(path)
        if f.schema != pl.Schema(ROW_SCHEMA):
            raise HybridlabError(f"lm-eval: {path} has columns {dict(f.schema)}, not {ROW_SCHEMA}; delete it and "
                                 "rerun its eval_lm_benchmarks job")
        frames.append(f)
    if not frames:
        raise HybridlabError("lm-eval: no per-model tables to gather")
    return pl.concat(frames)
