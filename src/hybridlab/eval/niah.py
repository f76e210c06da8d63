"""Multilingual needle-in-a-haystack, OneRULER-style (Kim et al. 2025, "One ruler to measure them all"): scoring,
the greedy runner and the tables of the eval_niah rule; the examples (tasks, needles, prompts fitted to a
length) are built in `hybridlab.eval.niah_examples`.

Scoring: normalise = lowercase and drop every non-alphanumeric character (punctuation, whitespace).
A value counts as found if its normalised form is a substring of the normalised prediction (RULER's
string match). `score` = fraction of expected values found (RULER's partial credit); `correct` =
all found, the HEADLINE accuracy (all-or-nothing, so multi-value/multi-query need every value).
For niah_none, correct iff the lowercased prediction contains the template's none word and no digit.

Runner: greedy decoding one example at a time (contexts are long; no padding). Each row records
wall time and peak memory: `torch.cuda.max_memory_allocated` on CUDA; on CPU the process peak RSS
(Linux: VmHWM reset through /proc/self/clear_refs before each example; elsewhere the process-lifetime
ru_maxrss, labelled `cpu_process_max_rss`). A CUDA out-of-memory error is a result row (oom=True)
of its own outcome, not a wrong answer: its `prediction`, `score` and `correct` are null, accuracy is
taken over the completed examples, and the OOM rate is reported beside it. Memory is freed and the run
continues; longer examples are then recorded as oom without running (`skipped=True`) unless
`skip_longer_after_oom=False`.

Memory cap (`memory_cap_gib`, `apply_memory_cap`): on CUDA the process may allocate at most that many GiB
(`torch.cuda.set_per_process_memory_fraction`; the caching allocator raises an out-of-memory error beyond
it), so the OOM cells and the memory-bound runtime of a smaller GPU are reproduced on a larger one. The cap
applied, min(cap, the device's memory), is recorded per row (`memory_cap_gib`; null: none, or not on CUDA).

YaRN: `run_niah(..., yarn_factor=F, native_window=W)` switches the model's RoPE to YaRN with factor F over
the original window W only for examples whose cell length (`target_tokens`) exceeds W, and back to the
native RoPE for the others (the answer's few generated tokens are not counted); W = None scales every
example over the config's `max_position_embeddings`. The factor applied is recorded per row (`yarn_factor`,
null: native RoPE, or a NoPE model with nothing to scale).
"""

from __future__ import annotations

import copy
import gc
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import polars as pl
import torch
from torch import nn

from hybridlab.device import resolve_device
from hybridlab.errors import HybridlabError
# the examples' names stay importable from here (hybridlab.eval.niah.<name>)
from hybridlab.eval.niah_examples import (  # noqa: F401
    DEFAULT_WORDS,
    N_DISTRACTORS,
    N_MULTI,
    N_NONE_DISTRACTORS,
    TASKS,
    NiahExample,
    NiahTemplate,
    build_niah_example,
    build_niah_suite,
    chat_prompt,
    has_chat_template,
    template_takes_thinking,
)


def normalise(text: str) -> str:
    """Lowercase and drop every non-alphanumeric character (punctuation and whitespace)."""
    return re.sub(r"[\W_]+", "", text.lower())


def score_prediction(prediction: str, answers: Sequence[str], task: str, none_word: str = "none") -> tuple[float, bool]:
    """(fraction of expected values found, all found); niah_none: none word and no digit."""
    if task == "niah_none":
        ok = none_word.lower() in prediction.lower() and not re.search(r"\d", prediction)
        return float(ok), ok
    if not answers:
        raise HybridlabError(f"task {task} needs expected answers")
    pred = normalise(prediction)
    found = sum(normalise(a) in pred for a in answers)
    return found / len(answers), found == len(answers)


GIB = 2 ** 30


def apply_memory_cap(cap_gib: float | None, device: str | torch.device) -> float | None:
    """Limit this process's CUDA allocations on `device` to `cap_gib` GiB (module docstring); returns the cap
    applied in GiB, min(cap, the device's memory), or None when no cap is set or the device is not CUDA."""
    if cap_gib is None:
        return None
    if cap_gib <= 0:
        raise HybridlabError(f"niah.memory_cap_gib must be > 0 GiB, got {cap_gib}; give a positive size or null")
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(dev).total_memory
    fraction = min(1.0, cap_gib * GIB / total)
    torch.cuda.set_per_process_memory_fraction(fraction, dev)
    return fraction * total / GIB


def _peak_memory_start(dev: torch.device) -> str:
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        return "cuda_max_allocated"
    if sys.platform.startswith("linux"):
        with open("/proc/self/clear_refs", "w") as f:  # "5" resets the VmHWM high-water mark
            f.write("5")
        return "cpu_peak_rss"
    return "cpu_process_max_rss"


def _peak_memory_bytes(dev: torch.device, kind: str) -> int:
    if kind == "cuda_max_allocated":
        return int(torch.cuda.max_memory_allocated(dev))
    if kind == "cpu_peak_rss":
        with open("/proc/self/status") as f:
            return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB elsewhere
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


ROW_SCHEMA = {"task": pl.String, "lang": pl.String, "target_tokens": pl.Int64, "context_tokens": pl.Int64,
              "depth": pl.Float64, "prediction": pl.String, "score": pl.Float64, "correct": pl.Boolean,
              "oom": pl.Boolean, "skipped": pl.Boolean, "yarn_factor": pl.Float64, "seconds": pl.Float64,
              "peak_memory_bytes": pl.Int64, "memory_kind": pl.String}


def yarn_for(target_tokens: int, factor: float | None, native_window: int | None) -> float | None:
    """The YaRN factor for a cell of `target_tokens`: `factor` when the cell's context exceeds the native
    window (always when `native_window` is None), else None (the native RoPE)."""
    if factor is None:
        return None
    return factor if native_window is None or target_tokens > native_window else None


def _text_config(model: nn.Module):
    config = getattr(model, "config", None)
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def config_window(model: nn.Module) -> int | None:
    """The window the model's config declares (`max_position_embeddings` of its text config), or None."""
    window = getattr(_text_config(model), "max_position_embeddings", None)
    return int(window) if window else None


class _RopeSwitch:
    """Switches a model between its native RoPE and YaRN (`hybridlab.models.rope.apply_yarn`) and back:
    the native rotary module and config fields are kept and restored, so each switch starts from them."""

    def __init__(self, model: nn.Module):
        self.model, self.factor = model, None
        self.decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        self.rotary = getattr(self.decoder, "rotary_emb", None)
        if self.rotary is not None:
            cfg = _text_config(model)
            self.saved = {k: copy.deepcopy(getattr(cfg, k)) for k in ("rope_parameters", "max_position_embeddings")
                          if hasattr(cfg, k)}

    def set(self, factor: float | None, native_window: int | None) -> float | None:
        """Apply `factor` (None: native RoPE); returns the factor in effect (None for a NoPE model)."""
        if self.rotary is None or factor == self.factor:
            return None if self.rotary is None else factor
        self.restore()
        if factor is not None:
            from hybridlab.models.rope import apply_yarn

            apply_yarn(self.model, factor, native_window)
            self.factor = factor
        return factor

    def restore(self) -> None:
        if self.rotary is None or self.factor is None:
            return
        cfg = _text_config(self.model)
        for k, v in self.saved.items():
            setattr(cfg, k, copy.deepcopy(v))
        self.decoder.rotary_emb = self.rotary
        self.factor = None


def run_niah(model: nn.Module, tokenizer: Any, examples: Sequence[NiahExample], max_new_tokens: int,
             device: str | torch.device | None = None, *, skip_longer_after_oom: bool = True,
             yarn_factor: float | None = None, native_window: int | None = None) -> pl.DataFrame:
    """Greedy-decode every example; one tidy row each (see ROW_SCHEMA); OOM is a row of its own outcome
    (prediction, score and correct null), not a crash and not a wrong answer. `yarn_factor` F scales RoPE
    with YaRN for the examples past `native_window` (`yarn_for`); the model is back on its native RoPE after."""
    if max_new_tokens < 1:
        raise HybridlabError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows, oom_at = [], None
    was_training = model.training
    rope = _RopeSwitch(model) if yarn_factor is not None else None
    model.eval()
    try:
        for ex in examples:
            factor = yarn_for(ex.target_tokens, yarn_factor, native_window)
            row: dict[str, Any] = {"task": ex.task, "lang": ex.lang, "target_tokens": ex.target_tokens,
                                   "context_tokens": ex.context_tokens, "depth": ex.depth, "prediction": None,
                                   "score": None, "correct": None, "oom": False, "skipped": False,
                                   "yarn_factor": rope.set(factor, native_window) if rope else None,
                                   "seconds": None, "peak_memory_bytes": None, "memory_kind": None}
            if skip_longer_after_oom and oom_at is not None and ex.context_tokens >= oom_at:
                rows.append(row | {"oom": True, "skipped": True})
                continue
            kind = _peak_memory_start(dev)
            start = time.perf_counter()
            try:
                extra = {"add_special_tokens": False} if ex.chat else {}  # the template has its own
                ids = tokenizer(ex.prompt, return_tensors="pt", **extra)["input_ids"].to(dev)
                with torch.inference_mode():
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=max_new_tokens, pad_token_id=pad_id)
                prediction = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
                if ex.scoring == "oneruler":
                    from hybridlab.eval.oneruler import score_oneruler

                    score, correct = score_oneruler(prediction, ex.answers, ex.task, ex.none_words)
                else:
                    score, correct = score_prediction(prediction, ex.answers, ex.task, ex.none_word)
                row |= {"prediction": prediction, "score": score, "correct": correct}
            except torch.OutOfMemoryError:
                row["oom"] = True
                oom_at = ex.context_tokens if oom_at is None else min(oom_at, ex.context_tokens)
            finally:
                row["seconds"] = time.perf_counter() - start
                row["peak_memory_bytes"] = _peak_memory_bytes(dev, kind)
                row["memory_kind"] = kind
                ids = out = None  # drop references before freeing cached blocks
                if row["oom"]:
                    gc.collect()
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
            rows.append(row)
    finally:
        if rope is not None:
            rope.restore()
        model.train(was_training)
    return pl.DataFrame(rows, schema=ROW_SCHEMA)


def _completed_aggs() -> list[pl.Expr]:
    """n = completed examples (the accuracy's denominator), accuracy and score over them (null when every
    example ran out of memory), n_oom, oom (any) and oom_rate = n_oom / (n + n_oom)."""
    done = ~pl.col("oom")
    return [done.sum().cast(pl.Int64).alias("n"), pl.col("correct").filter(done).mean().alias("accuracy"),
            pl.col("score").filter(done).mean().alias("score"), pl.col("oom").sum().cast(pl.Int64).alias("n_oom")]


def summarise_niah(results: pl.DataFrame) -> pl.DataFrame:
    """Per (lang, task, length): n completed examples, accuracy and mean score over them (an OOM is its own
    outcome, not a wrong answer), n_oom and the OOM rate, mean seconds and peak memory."""
    return (results.group_by("lang", "task", "target_tokens")
            .agg(*_completed_aggs(), pl.col("oom").mean().alias("oom_rate"),
                 pl.col("seconds").mean().alias("seconds"),
                 pl.col("peak_memory_bytes").max().alias("peak_memory_bytes"))
            .sort("lang", "task", "target_tokens"))


# --- the NIAH tables of the eval_niah rule ---------------------------------------------------------------

def answer_budgets(tokenizer: Any, examples: Sequence[NiahExample], slack: int) -> list[tuple[list[NiahExample], int]]:
    """(examples of one task, max_new_tokens) per task, in task order of first appearance: the task's
    longest expected answer in `tokenizer`'s tokens (values joined by the template's joiner, or the none
    word, after a space) plus `slack`, so single-value tasks do not pay for the values of multi-value ones."""
    tpl = NiahTemplate()
    by_task: dict[str, list] = {}
    for ex in examples:
        by_task.setdefault(ex.task, []).append(ex)
    out = []
    for task, exs in by_task.items():
        longest = max(len(tokenizer(" " + (tpl.joiner.join(ex.answers) or ex.none_word),
                                    add_special_tokens=False)["input_ids"]) for ex in exs)
        out.append((exs, longest + slack))
    return out


NIAH_SETTINGS = ("native_window", "prompts", "chat_template", "yarn_factor", "memory_cap_gib")


def native_window_of(m: Any, model: nn.Module, windows: dict[str, int] | None) -> int | None:
    """The native context window of analysis model `m` (a `pairs.AnalysisModel`) for YaRN: `windows`
    (`niah.native_window`) by model name; a distilled student (not a hub model, named
    `<teacher>/<placement>-<mixer>`) without an entry of its own takes its teacher's; else the model config's
    `max_position_embeddings`. `windows` None (the key absent): None, every example is scaled."""
    if windows is None:
        return None
    if m.name in windows:
        return int(windows[m.name])
    student = not m.hub and m.pairs.get(m.name) == "hybrid" and "/" in m.name  # named after its pair
    teacher = m.name.rsplit("/", 1)[0] if student else None
    if teacher is not None and teacher in windows:
        return int(windows[teacher])
    return config_window(model)


def niah_tables(mono: pl.DataFrame | None, params: "NiahJob | dict", *, device: str | None = None, log=print
                ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-example table, summary table) of every analysis model: `niah_model_examples` of each model,
    concatenated, and their `niah_summary` (the eval_niah jobs run one model each; niah_tables gathers)."""
    from hybridlab.config_spec import NiahJob, job_settings, to_dict
    from hybridlab.eval import pairs

    params = job_settings(NiahJob, params, "eval_niah.py")
    names = [m.name for m in pairs.analysis_models(**to_dict(params.models))]
    suites: dict[str, list] = {}  # models sharing a tokenizer share their examples
    examples = pl.concat([niah_model_examples(mono, params, name, device=device, log=log, suites=suites)
                          for name in names]).sort("model", "pair", "lang", "task", "target_tokens", "depth",
                                                   maintain_order=True)
    return examples, niah_summary(examples, log=log)


def _haystacks(mono: pl.DataFrame | None, cfg, seed: int):
    from hybridlab.eval import pairs

    if cfg.prompts == "oneruler":
        from hybridlab.eval.oneruler import load_language

        oneruler = {lang: load_language(cfg.oneruler_dir, lang) for lang in cfg.languages}
        return {lang: list(o.sentences) for lang, o in oneruler.items()}, oneruler
    docs = pairs.mono_documents(mono, cfg.languages, seed)
    return {lang: pairs.haystack_sentences(texts) for lang, texts in docs.items()}, None


def niah_model_examples(mono: pl.DataFrame | None, params: "NiahJob | dict", model: str, *, device: str | None = None,
                        work: str | Path | None = None, log=print, suites: dict | None = None) -> pl.DataFrame:
    """Per-example rows (workflow_scripts/eval_niah.py documents the columns) of analysis model `model` of the
    multilingual needle-in-a-haystack evaluation.

    `mono`: the monolingual corpus (doc_id, lang, text, source), the haystack source with `prompts:
    project` (unused with `oneruler`). `params`: the job's section (`hybridlab.config_spec.NiahJob`, or its
    dict): the models (the pairs `model` belongs to), dtype, seed and `eval.analysis.niah`.

    Haystacks are each language's documents in a seeded order split into sentences
    (`pairs.haystack_sentences`), or OneRULER's books; examples are built per tokenizer with the seed
    (`build_niah_suite`; `suites` caches them across calls) so context lengths are that model's tokens,
    and decoded greedily per task with the budget of `answer_budgets` (`run_niah`). `chat_template`
    applies where the tokenizer has one (with enable_thinking=False where the template reads it);
    `yarn_factor` F applies YaRN RoPE scaling: with `native_window` ({model name: tokens}, see
    `native_window_of`) only to the cells longer than the model's native window, without it to every cell
    over the config's window (null for NoPE models and unscaled cells).

    `work`: a directory where each finished task's rows are kept (`task-<name>.parquet`, under a
    fingerprint of the params and the model's files: `hybridlab.train.run.work_dir`); a rerun reads them
    instead of decoding that task again, so a job killed mid-way loses at most one task.
    """
    from hybridlab.config_spec import NiahJob, job_settings, to_dict
    from hybridlab.eval import pairs

    job = job_settings(NiahJob, params, "eval_niah.py")
    cfg, seed = job.niah, job.seed
    prompts, chat, yarn = cfg.prompts, cfg.chat_template, cfg.yarn_factor
    windows = cfg.native_window
    device = resolve_device(device)
    found = [m for m in pairs.analysis_models(**to_dict(job.models)) if m.name == model]
    if not found:
        raise HybridlabError(f"niah: model {model!r} is not among the analysis models of the params; "
                             "check the model name")
    m = found[0]
    if work is not None:
        from hybridlab.train.run import work_dir

        local = [p for p in (m.path,) if Path(p).exists()]
        work = work_dir(work, {"model": model, **to_dict(job)}, local)
    haystacks, oneruler = _haystacks(mono, cfg, seed)

    log(f"niah {model}: {cfg.tasks} x {cfg.context_tokens} tokens x {cfg.examples_per_cell} per cell, "
        f"languages {cfg.languages}, device {device}")
    t0 = time.perf_counter()
    cap = apply_memory_cap(cfg.memory_cap_gib, device)
    if cap is not None:
        log(f"  CUDA allocations capped at {cap:.1f} GiB (niah.memory_cap_gib {cfg.memory_cap_gib})")
    lm, tok = pairs.load_analysis_model(m, dtype=job.dtype, device=device)
    native = native_window_of(m, lm, windows) if yarn is not None else None
    settings = pl.DataFrame({"prompts": [prompts], "chat_template": [chat and has_chat_template(tok)],
                             "native_window": [native], "memory_cap_gib": [cap]},
                            schema={"prompts": pl.String, "chat_template": pl.Boolean, "native_window": pl.Int64,
                                    "memory_cap_gib": pl.Float64})
    suites = {} if suites is None else suites
    if m.tokenizer not in suites:
        suites[m.tokenizer] = build_niah_suite(tok, haystacks, tasks=cfg.tasks, lengths=cfg.context_tokens,
                                               n_per_cell=cfg.examples_per_cell, seed=seed,
                                               oneruler=oneruler, chat=chat)
    parts = []
    for examples, budget in answer_budgets(tok, suites[m.tokenizer], cfg.answer_slack_tokens):
        done = Path(work) / f"task-{examples[0].task}.parquet" if work is not None else None
        if done is not None and done.is_file():
            log(f"  {model} {examples[0].task}: rows of a finished run reused ({done})")
            parts.append(pl.read_parquet(done))
            continue
        rows = run_niah(lm, tok, examples, budget, device=device, yarn_factor=yarn, native_window=native)
        if done is not None:
            from hybridlab.atomic import atomic_file

            with atomic_file(done) as tmp:
                rows.write_parquet(tmp)
        parts.append(rows)
    rows = pl.concat(parts)
    del lm
    log(f"  {model}: {rows.height} examples, {int(rows['oom'].sum())} OOM, accuracy over completed "
        f"{rows['correct'].mean() or 0.0:.3f}, native window {native}, {time.perf_counter() - t0:.1f}s")
    examples = (pl.DataFrame(pairs.pair_rows(m)).join(settings, how="cross").join(rows, how="cross")
                .sort("model", "pair", "lang", "task", "target_tokens", "depth", maintain_order=True))
    head = ["model", "pair", "role", "prompts", "chat_template", "yarn_factor", "native_window", "memory_cap_gib"]
    return examples.select(head + [c for c in examples.columns if c not in head])


def niah_summary(examples: pl.DataFrame, log=print) -> pl.DataFrame:
    """One row per (model, pair, lang, task, context_tokens) of the per-example rows of every model: n
    (completed examples), accuracy and score over them (an OOM is not a wrong answer), mean_prompt_tokens,
    seconds, peak_memory_bytes, memory_kind, oom (any), n_oom, oom_rate = n_oom / (n + n_oom), then the
    settings columns native_window (null: not given), prompts, chat_template, yarn_factor (applied),
    memory_cap_gib (applied)."""
    examples = examples.sort("model", "pair", "lang", "task", "target_tokens", "depth", maintain_order=True)
    summary = (examples.group_by("model", "pair", "role", "lang", "task", "target_tokens", *NIAH_SETTINGS)
               .agg(*_completed_aggs(), pl.col("context_tokens").mean().alias("mean_prompt_tokens"),
                    pl.col("seconds").mean(), pl.col("peak_memory_bytes").max(), pl.col("memory_kind").first(),
                    pl.col("oom").any(), pl.col("oom").mean().alias("oom_rate"))
               .rename({"target_tokens": "context_tokens"})
               .sort("model", "pair", "lang", "task", "context_tokens"))
    # the settings after the measurements (the table's schema order)
    summary = summary.select([c for c in summary.columns if c not in ("n_oom", "oom_rate", *NIAH_SETTINGS)]
                             + ["n_oom", "oom_rate", *NIAH_SETTINGS])
    log(str(summary.group_by("model", "context_tokens").agg(pl.col("accuracy").mean(), pl.col("seconds").mean())
            .sort("model", "context_tokens")))
    return summary


def gather_niah(paths: Sequence[str | Path], log=print) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-example table, summary table) from the per-model example tables of the eval_niah jobs; a table
    whose columns differ from the first one's is one line naming it (rebuild that model's job)."""
    frames = [pl.read_parquet(p) for p in paths]
    if not frames:
        raise HybridlabError("niah: no per-model tables to gather")
    for path, f in zip(paths, frames):
        if f.schema != frames[0].schema:
            raise HybridlabError(f"niah: {path} has other columns than {paths[0]}; delete it and rerun its "
                                 "eval_niah job")
    examples = pl.concat(frames).sort("model", "pair", "lang", "task", "target_tokens", "depth", maintain_order=True)
    return examples, niah_summary(examples, log=log)
