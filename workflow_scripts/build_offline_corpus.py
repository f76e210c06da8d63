"""Build the offline multilingual corpus (parallel.parquet, mono.parquet, manifest.json).

Usage:
    build_offline_corpus.py (--config-json FILE | --params JSON) --cache DIR --out DIR [--apt-update]

The config is an `OfflineCorpusConfig` as a JSON object (see hybridlab.data.offline). `--apt-update`
first fills private package lists under DIR/apt (no root needed) for machines whose system lists are
missing. A user error prints one line to stderr and exits 1.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from _common import run

from hybridlab.pipeline.jobs.data import offline_corpus_job

PARAMS = """config keys (OfflineCorpusConfig): parallel_languages, mono_languages, packages (required);
min_english_words, max_parallel_sentences, max_mono_docs_per_language, sentences_per_doc, english_bible_docs,
seed, min_parallel_sentences, mono_min_english_words, min_script_fraction"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, epilog=PARAMS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-json", type=Path, help="JSON file holding the OfflineCorpusConfig fields")
    src.add_argument("--params", help="the same JSON object inline")
    p.add_argument("--cache", type=Path, required=True, help="package cache (reused across runs)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--apt-update", action="store_true", help="fetch private apt package lists into CACHE/apt")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print("\n".join(offline_corpus_job(args.config_json, args.params, args.cache, args.out, apt_update=args.apt_update)))


if __name__ == "__main__":
    run(main)
