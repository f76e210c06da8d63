"""Standard benchmarks through EleutherAI's lm-evaluation-harness (paper preset only).

Runs lm-eval's `HFLM` wrapper around a model that is already loaded (so converted hybrids and the BLD
models, which `AutoModelForCausalLM.from_pretrained` cannot rebuild, are evaluated like any transformers
model) on the study's tasks: arc_easy, arc_challenge, hellaswag, piqa, boolq, winogrande, lambada_openai,
wikitext, swde, fda, squad_completion (the recall-intensive tasks of the "Based" / "Just read twice"
line of work) and the RULER group at each of `ruler_lengths` (lm-eval's `max_seq_lengths` metadata;
RULER builds its synthetic inputs with the tokenizer named in `tokenizer_name`, a hub id or a local
directory holding tokenizer files).

lm-eval is an optional dependency (`pip install "lm-eval[hf]"`, plus the extras of the RULER and
recall tasks): without it, or when its task data cannot be fetched (offline hub), the run stops with
one `HybridlabError` line. Results become tidy rows (model, task, metric, filter, value, stderr): one
per numeric metric of every task and group lm-eval reports (RULER's metrics are the sequence lengths,
e.g. metric "4096").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import polars as pl

from hybridlab.errors import HybridlabError

PAPER_TASKS = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "boolq", "winogrande", "lambada_openai", "wikitext",
               "swde", "fda", "squad_completion")
RULER_LENGTHS = (1024, 2048, 4096, 8192, 16384)
INSTALL_HINT = 'pip install "lm-eval[hf]" (and its ruler / recall-task extras)'
ROW_SCHEMA = {"model": pl.String, "task": pl.String, "metric": pl.String, "filter": pl.String,
              "value": pl.Float64, "stderr": pl.Float64}
_OFFLINE_TYPES = ("OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectionError", "ConnectTimeout",
                  "MaxRetryError", "NameResolutionError")


@dataclass(frozen=True)
class LMEvalConfig:
    tasks: tuple[str, ...] = PAPER_TASKS
    ruler_lengths: tuple[int, ...] = RULER_LENGTHS  # empty: no RULER
    num_fewshot: int | None = None  # None: each task's default
    batch_size: int | str = 1
    limit: int | float | None = None  # examples per task (a fraction if < 1); None: all
    max_length: int | None = None  # None: the longest RULER length (or the model's own limit)
    seed: int = 1234

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "ruler_lengths", tuple(self.ruler_lengths))
        if not self.tasks and not self.ruler_lengths:
            raise HybridlabError("lm-eval: no tasks and no RULER lengths; give at least one task")
        if any(n < 1 for n in self.ruler_lengths):
            raise HybridlabError(f"lm-eval: RULER lengths must be positive, got {list(self.ruler_lengths)}")


def build_arguments(cfg: LMEvalConfig, *, tokenizer_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(HFLM keyword arguments, simple_evaluate keyword arguments) for `cfg`."""
    tasks = list(cfg.tasks)
    metadata: dict[str, Any] = {}
    if cfg.ruler_lengths:
        tasks.append("ruler")
        metadata = {"max_seq_lengths": sorted(cfg.ruler_lengths), "tokenizer": tokenizer_name}
    max_length = cfg.max_length or (max(cfg.ruler_lengths) if cfg.ruler_lengths else None)
    hflm = {"batch_size": cfg.batch_size}
    if max_length is not None:
        hflm["max_length"] = max_length
    evaluate = {"tasks": tasks, "num_fewshot": cfg.num_fewshot, "batch_size": cfg.batch_size, "limit": cfg.limit,
                "log_samples": False, "random_seed": cfg.seed, "numpy_random_seed": cfg.seed,
                "torch_random_seed": cfg.seed, "fewshot_random_seed": cfg.seed}
    if metadata:
        evaluate["metadata"] = metadata
    return hflm, evaluate


def require_lm_eval():
    """The `lm_eval` module, or one line saying how to install it."""
    try:
        module = importlib.import_module("lm_eval")
        importlib.import_module("lm_eval.models.huggingface")
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


def run_lm_eval(model, tokenizer, cfg: LMEvalConfig, *, tokenizer_name: str, model_name: str) -> pl.DataFrame:
    """Evaluate an already-loaded causal LM with lm-eval; tidy rows (see `results_table`)."""
    lm_eval = require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    hflm_kwargs, evaluate_kwargs = build_arguments(cfg, tokenizer_name=tokenizer_name)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, **hflm_kwargs)
    try:
        results = lm_eval.simple_evaluate(model=lm, **evaluate_kwargs)
    except Exception as exc:  # lm-eval surfaces dataset download failures as many exception types
        if _offline_cause(exc):
            raise HybridlabError(
                f"lm-eval could not fetch its task data for {model_name} (offline or unreachable hub: "
                f"{type(exc).__name__}); run once online to fill the datasets cache, then retry") from exc
        raise
    if not results or "results" not in results:
        raise HybridlabError(f"lm-eval returned no results for {model_name} (non-zero rank of a multi-process run?)")
    return results_table(results, model_name)


def results_table(results: dict, model_name: str) -> pl.DataFrame:
    """One row per numeric `metric,filter` entry of `results["results"]` (stderr joined in, null if N/A)."""
    rows = []
    for task, metrics in sorted(results["results"].items()):
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            rows.append({"model": model_name, "task": task, "metric": metric, "filter": filt, "value": float(value),
                         "stderr": float(stderr) if isinstance(stderr, (int, float)) else None})
    if not rows:
        raise HybridlabError(f"lm-eval results for {model_name} hold no numeric metric; check the task names")
    return pl.DataFrame(rows, schema=ROW_SCHEMA)
