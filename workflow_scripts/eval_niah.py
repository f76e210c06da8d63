"""Multilingual needle-in-a-haystack table (OneRULER-style), per model, language, task and context length.

Haystacks are each configured language's monolingual documents split into sentences
(`hybridlab.eval.pairs.haystack_sentences`); examples are built in each model's own tokenizer so the
context lengths are that model's tokens (`hybridlab.eval.niah.build_niah_suite`: `examples_per_cell`
seeded examples per language x task x length) and greedily decoded (`run_niah`: wall time, peak
memory, OOM as a result). The generation budget of a task is its longest expected answer in the model's
tokens (values joined by the template's joiner, or the none word) plus `answer_slack_tokens`, so
single-value tasks do not pay for the four values of multi-value ones. Prompt templates are English in
every language (the library's documented choice).

Outputs (tidy parquet):
`--out`, one row per (model, pair, lang, task, context_tokens):
  model, pair, role (hybrid | dense), lang, task, context_tokens (the target length of the cell),
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
        longest = max(len(tokenizer(" " + (tpl.joiner.join(ex.answers) or tpl.none_word),
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
    from hybridlab.eval.niah import build_niah_suite, run_niah

    cfg = params["niah"]
    device = pairs.analysis_device()
    docs = pairs.mono_documents(pl.read_parquet(args.mono), cfg["languages"], params["seed"])
    haystacks = {lang: pairs.haystack_sentences(texts) for lang, texts in docs.items()}
    print(f"niah: {cfg['tasks']} x {cfg['context_tokens']} tokens x {cfg['examples_per_cell']} per cell, "
          f"languages {cfg['languages']}, device {device}")
    suites: dict[str, list] = {}  # models sharing a tokenizer share their examples
    tables = []
    for m in pairs.analysis_models(**params["models"]):
        t0 = time.perf_counter()
        model, tok = pairs.load_analysis_model(m, dtype=params["dtype"], device=device)
        if m.tokenizer not in suites:
            suites[m.tokenizer] = build_niah_suite(tok, haystacks, tasks=cfg["tasks"], lengths=cfg["context_tokens"],
                                                   n_per_cell=cfg["examples_per_cell"], seed=params["seed"])
        rows = pl.concat([run_niah(model, tok, examples, budget, device=device)
                          for examples, budget in _by_budget(tok, suites[m.tokenizer], cfg["answer_slack_tokens"])])
        tables.append(pl.DataFrame(pairs.pair_rows(m)).join(rows, how="cross"))
        del model
        print(f"  {m.name}: {rows.height} examples, accuracy {rows['correct'].mean():.3f}, "
              f"{time.perf_counter() - t0:.1f}s")

    examples = pl.concat(tables).sort("model", "pair", "lang", "task", "target_tokens", "depth")
    summary = (examples.group_by("model", "pair", "role", "lang", "task", "target_tokens")
               .agg(pl.len().alias("n"), pl.col("correct").mean().alias("accuracy"),
                    pl.col("score").mean(), pl.col("context_tokens").mean().alias("mean_prompt_tokens"),
                    pl.col("seconds").mean(), pl.col("peak_memory_bytes").max(), pl.col("memory_kind").first(),
                    pl.col("oom").any(), pl.col("oom").mean().alias("oom_rate"))
               .rename({"target_tokens": "context_tokens"})
               .sort("model", "pair", "lang", "task", "context_tokens"))
    pairs.write_table(examples, args.examples)
    pairs.write_table(summary, args.out)
    print(summary.group_by("model", "context_tokens").agg(pl.col("accuracy").mean(), pl.col("seconds").mean())
          .sort("model", "context_tokens"))


if __name__ == "__main__":
    _common.run(main)
