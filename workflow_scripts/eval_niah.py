"""Multilingual needle-in-a-haystack table (OneRULER-style), per model, language, task and context length.

Haystacks are each configured language's monolingual documents split into sentences
(`hybridlab.eval.pairs.haystack_sentences`); examples are built in each model's own tokenizer so the
context lengths are that model's tokens (`hybridlab.eval.niah.build_niah_suite`: `examples_per_cell`
seeded examples per language x task x length) and greedily decoded (`run_niah`: wall time, peak
memory, OOM as a result). The generation budget of a task is its longest expected answer in the model's
tokens (values joined by the template's joiner, or the none word) plus `answer_slack_tokens`, so
single-value tasks do not pay for the four values of multi-value ones. Prompts: `prompts: project` uses
the library's English templates in every language; `prompts: oneruler` reads OneRULER's own prompts, key
words and books from `oneruler_dir` and scores as OneRULER does (`hybridlab.eval.oneruler`).
`chat_template: true` wraps prompts in each model's chat template; `yarn_factor: F` evaluates with YaRN
RoPE scaling by F (`hybridlab.models.rope`). All three are columns of both tables.

Outputs (tidy parquet):
`--out`, one row per (model, pair, lang, task, context_tokens):
  model, pair, role (hybrid | dense), lang, task, context_tokens (the target length of the cell),
  prompts (project | oneruler), chat_template (applied: configured and the tokenizer has one), yarn_factor
  (applied factor; null = none or a NoPE model),
  n (examples), accuracy (mean all-values-found; OOM counts as wrong), score (mean fraction of values
  found), mean_prompt_tokens (actual prompt length, <= target), seconds (mean wall time per example),
  peak_memory_bytes (max over the cell), memory_kind, oom (any example of the cell ran out of memory),
  oom_rate
`--examples`, one row per example: model, pair, role, lang, task, target_tokens, context_tokens (actual),
  depth, prediction, score, correct, oom, skipped, seconds, peak_memory_bytes, memory_kind
"""

import time

import _common


def _by_budget(tokenizer, examples, slack: int):
    """(examples of one task, max_new_tokens) per task, in task order of first appearance."""
    from hybridlab.eval.niah import NiahTemplate

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


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--mono", required=True, help="monolingual corpus parquet (doc_id, lang, text, source)")
    p.add_argument("--out", required=True, help="summary table (.parquet)")
    p.add_argument("--examples", required=True, help="per-example table (.parquet)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import polars as pl

    from hybridlab.eval import pairs
    from hybridlab.eval.niah import build_niah_suite, has_chat_template, run_niah

    cfg = params["niah"]
    prompts, chat, yarn = cfg.get("prompts", "project"), bool(cfg.get("chat_template", False)), cfg.get("yarn_factor")
    device = pairs.analysis_device()
    oneruler = None
    if prompts == "oneruler":
        from hybridlab.eval.oneruler import load_language

        oneruler = {lang: load_language(cfg["oneruler_dir"], lang) for lang in cfg["languages"]}
        haystacks = {lang: list(o.sentences) for lang, o in oneruler.items()}
    else:
        docs = pairs.mono_documents(pl.read_parquet(args.mono), cfg["languages"], params["seed"])
        haystacks = {lang: pairs.haystack_sentences(texts) for lang, texts in docs.items()}

    print(f"niah: {cfg['tasks']} x {cfg['context_tokens']} tokens x {cfg['examples_per_cell']} per cell, "
          f"languages {cfg['languages']}, device {device}")
    suites: dict[str, list] = {}  # models sharing a tokenizer share their examples
    tables = []
    for m in pairs.analysis_models(**params["models"]):
        t0 = time.perf_counter()
        model, tok = pairs.load_analysis_model(m, dtype=params["dtype"], device=device)
        applied = None
        if yarn is not None:
            from hybridlab.models.rope import apply_yarn

            applied = yarn if apply_yarn(model, yarn) is not None else None  # None: a NoPE model
        settings = pl.DataFrame({"prompts": [prompts], "chat_template": [chat and has_chat_template(tok)],
                                 "yarn_factor": [applied]},
                                schema={"prompts": pl.String, "chat_template": pl.Boolean, "yarn_factor": pl.Float64})
        if m.tokenizer not in suites:
            suites[m.tokenizer] = build_niah_suite(tok, haystacks, tasks=cfg["tasks"], lengths=cfg["context_tokens"],
                                                   n_per_cell=cfg["examples_per_cell"], seed=params["seed"],
                                                   oneruler=oneruler, chat=chat)
        rows = pl.concat([run_niah(model, tok, examples, budget, device=device)
                          for examples, budget in _by_budget(tok, suites[m.tokenizer], cfg["answer_slack_tokens"])])
        tables.append(pl.DataFrame(pairs.pair_rows(m)).join(settings, how="cross").join(rows, how="cross"))
        del model
        print(f"  {m.name}: {rows.height} examples, accuracy {rows['correct'].mean():.3f}, "
              f"{time.perf_counter() - t0:.1f}s")

    examples = pl.concat(tables).sort("model", "pair", "lang", "task", "target_tokens", "depth")
    summary = (examples.group_by("model", "pair", "role", "lang", "task", "target_tokens", "prompts", "chat_template",
                                 "yarn_factor")
               .agg(pl.len().alias("n"), pl.col("correct").mean().alias("accuracy"),
                    pl.col("score").mean(), pl.col("context_tokens").mean().alias("mean_prompt_tokens"),
                    pl.col("seconds").mean(), pl.col("peak_memory_bytes").max(), pl.col("memory_kind").first(),
                    pl.col("oom").any(), pl.col("oom").mean().alias("oom_rate"))
               .rename({"target_tokens": "context_tokens"})
               .sort("model", "pair", "lang", "task", "context_tokens"))
    settings_cols = ["prompts", "chat_template", "yarn_factor"]  # after the measurements (table schema order)
    summary = summary.select([c for c in summary.columns if c not in settings_cols] + settings_cols)
    pairs.write_table(examples, args.examples)
    pairs.write_table(summary, args.out)
    print(summary.group_by("model", "context_tokens").agg(pl.col("accuracy").mean(), pl.col("seconds").mean())
          .sort("model", "context_tokens"))


if __name__ == "__main__":
    _common.run(main)
