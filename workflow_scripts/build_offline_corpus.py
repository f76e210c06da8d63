"""Build the offline multilingual corpus (parallel.parquet, mono.parquet, manifest.json).

Usage:
    build_offline_corpus.py (--config-json FILE | --params JSON) --cache DIR --out DIR [--apt-update]

The config is an `OfflineCorpusConfig` as a JSON object (see hybridlab.data.offline). `--apt-update`
first fills private package lists under DIR/apt (no root needed) for machines whose system lists are
missing. A user error prints one line to stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from _common import run

from hybridlab.data.offline import OfflineCorpusConfig, build_offline_corpus
from hybridlab.data.offline_debs import apt_update_private
from hybridlab.errors import HybridlabError


def _parse_object(text: str, label: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HybridlabError(f"{label} is not valid JSON ({exc.msg} at line {exc.lineno}); fix the JSON object")
    if not isinstance(value, dict):
        raise HybridlabError(f"{label} must hold a JSON object of OfflineCorpusConfig fields")
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-json", type=Path, help="JSON file holding the OfflineCorpusConfig fields")
    src.add_argument("--params", help="the same JSON object inline")
    p.add_argument("--cache", type=Path, required=True, help="package cache (reused across runs)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--apt-update", action="store_true", help="fetch private apt package lists into CACHE/apt")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.config_json is not None:
        try:
            text = args.config_json.read_text(encoding="utf-8")
        except OSError as exc:
            raise HybridlabError(f"cannot read --config-json {args.config_json} ({exc.strerror}); "
                                 f"pass an existing file")
        params = _parse_object(text, f"--config-json {args.config_json}")
    else:
        params = _parse_object(args.params, "--params")
    cfg = OfflineCorpusConfig.from_dict(params)
    if args.apt_update:
        apt_update_private(args.cache)
    start = time.perf_counter()
    manifest = build_offline_corpus(cfg, args.cache, args.out)
    par, mono = manifest["parallel"], manifest["mono"]
    print(f"offline corpus in {time.perf_counter() - start:.1f}s: parallel {len(par['languages'])} languages x "
          f"{par['n_sentences']} sentences; mono {len(mono['languages'])} languages, "
          f"{sum(v['chars'] for v in mono['per_language'].values())} chars -> {args.out}")
    for kind, missing in manifest["unavailable"].items():
        for code, reason in missing.items():
            print(f"  unavailable ({kind}) {code}: {reason}")


if __name__ == "__main__":
    run(main)
