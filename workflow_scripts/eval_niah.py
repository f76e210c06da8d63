"""Multilingual needle-in-a-haystack tables (OneRULER-style), per model, language, task and context length.

Writes (tidy parquet; definitions: `hybridlab.eval.niah.niah_tables`)
`--out`, one row per (model, pair, lang, task, context_tokens): model, pair, role, lang, task, context_tokens
  (the cell's target length), n, accuracy, score, mean_prompt_tokens, seconds, peak_memory_bytes, memory_kind,
  oom, oom_rate, prompts (project | oneruler), chat_template (applied), yarn_factor (applied; null = none)
`--examples`, one row per example: model, pair, role, prompts, chat_template, yarn_factor, lang, task,
  target_tokens, context_tokens (actual), depth, prediction, score, correct, oom, skipped, seconds,
  peak_memory_bytes, memory_kind
"""

from pathlib import Path

import _common

PARAMS = """--params keys: models (hybridlab.eval.pairs.analysis_models: distilled, hub_pairs), dtype, seed,
niah: languages, tasks, context_tokens, examples_per_cell, answer_slack_tokens, prompts (project | oneruler,
  default project), oneruler_dir (with prompts: oneruler), chat_template (default false), yarn_factor (optional)"""


def main() -> None:
    p = _common.parser(__doc__, PARAMS)
    p.add_argument("--mono", type=Path, required=True, help="monolingual corpus parquet (doc_id, lang, text, source)")
    p.add_argument("--out", type=Path, required=True, help="summary table (.parquet)")
    p.add_argument("--examples", type=Path, required=True, help="per-example table (.parquet)")
    args = p.parse_args()

    import polars as pl

    from hybridlab.eval.niah import niah_tables
    from hybridlab.eval.pairs import write_table

    examples, summary = niah_tables(pl.read_parquet(args.mono), _common.load_params(args.params))
    write_table(examples, args.examples)
    write_table(summary, args.out)


if __name__ == "__main__":
    _common.run(main)
