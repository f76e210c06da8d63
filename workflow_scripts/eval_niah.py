"""Multilingual needle-in-a-haystack tables (OneRULER-style), per model, language, task and context length.

Writes (tidy parquet; definitions: `hybridlab.eval.niah.niah_tables`)
`--out`, one row per (model, pair, lang, task, context_tokens): model, pair, role, lang, task, context_tokens
  (the cell's target length), n (examples completed), accuracy and score (over the completed examples: an
  out-of-memory example is its own outcome, not a wrong answer), mean_prompt_tokens, seconds,
  peak_memory_bytes, memory_kind, oom (any), n_oom, oom_rate (n_oom / (n + n_oom)), native_window (the
  model's window for YaRN; null: niah.native_window not given), prompts (project | oneruler), chat_template
  (applied), yarn_factor (applied to the cell; null = native RoPE), memory_cap_gib (the CUDA memory cap
  applied, GiB; null: none)
`--examples`, one row per example: model, pair, role, prompts, chat_template, yarn_factor, native_window,
  memory_cap_gib, lang,
  task, target_tokens, context_tokens (actual), depth, prediction, score, correct (prediction, score and correct
  null on an OOM), oom, skipped, seconds, peak_memory_bytes, memory_kind
"""

from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import NiahJob

    p = _common.parser(__doc__, NiahJob)
    p.add_argument("--mono", type=Path, required=True, help="monolingual corpus parquet (doc_id, lang, text, source)")
    p.add_argument("--model", help="one analysis model (its name): write its per-example table to --examples "
                                   "only (the rule's per-model jobs; gather_eval.py niah builds both tables)")
    p.add_argument("--work", type=Path, help="with --model: each finished task's rows are kept here; a rerun "
                                             "decodes only the rest")
    p.add_argument("--out", type=Path, help="summary table (.parquet; every model, without --model)")
    p.add_argument("--examples", type=Path, required=True, help="per-example table (.parquet)")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.eval import niah_job

    niah_job(_common.load_job(NiahJob, args.params), mono=args.mono, examples=args.examples, out=args.out,
             model=args.model, work=args.work)


if __name__ == "__main__":
    _common.run(main)
