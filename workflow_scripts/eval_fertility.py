"""Fertility table: tokens per sentence relative to English on the parallel corpus, per tokenizer.

Tokenizers (deduplicated by name): `project` = the tokenizer of the data phase (the BPE trained in the
DAG at smoke/tiny, the fetched hub tokenizer at paper), every hub analysis model's own tokenizer
(paper), `eval.analysis.fertility.hub_tokenizers` (paper), and the reference `utf8_bytes` (one token
per UTF-8 byte: the script's own cost, which a byte-level BPE starts from). Definitions in `hybridlab.eval.fertility`;
English is the reference (ratio 1), every language of the corpus gets a row.

Output `--out` (tidy parquet), one row per (tokenizer, lang):
  tokenizer, lang, n_sentences (sids shared with English), tokens_per_sentence,
  relative_to_english (ratio of token totals; the headline), mean_sentence_ratio
"""

import _common


def main() -> None:
    from hybridlab.config_spec import FertilityJob

    p = _common.parser(__doc__, FertilityJob)
    p.add_argument("--parallel", required=True, help="parallel corpus parquet (sid, lang, text, source)")
    p.add_argument("--tokenizer", required=True, help="the data phase's tokenizer directory")
    p.add_argument("--out", required=True, help="output table (.parquet)")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.eval import fertility_job

    fertility_job(_common.load_job(FertilityJob, args.params), parallel=args.parallel, tokenizer=args.tokenizer,
                  out=args.out)


if __name__ == "__main__":
    _common.run(main)
