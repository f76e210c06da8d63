"""Hub presets: parallel text from FLoRes+ (or the FLORES-200 release) and monolingual text from FineWeb-2 +
FineWeb/DCLM.

Writes the same files as the offline builder: parallel.parquet, mono.parquet, manifest.json
(`hybridlab.pipeline.jobs.data.hub_corpus_job`), the monolingual text streamed one language at a time. `local_sources`
({flores_plus, flores200, fineweb2, fineweb, dclm, ntrex128}: directory or null, from the config key of the same
name) points at local copies in each hub's own
layout (see `hybridlab.data.local_sources`); null reads the hub, or its snapshot in the HF cache when
HF_HUB_OFFLINE=1. `flores200` set: the parallel text is the FLORES-200 text release. HF_TOKEN: the hub token.
"""

import os
from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import HubCorpusJob

    p = _common.parser(__doc__, HubCorpusJob)
    p.add_argument("--cache", help="unused by the hub source (datasets keeps its own cache)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.data import hub_corpus_job

    manifest = hub_corpus_job(_common.load_job(HubCorpusJob, args.params), args.out, token=os.environ.get("HF_TOKEN"))
    print(f"parallel: {sum(n for _, n in manifest['parallel'])} rows; "
          f"mono: {sum(n for _, n in manifest['mono_docs'])} docs")


if __name__ == "__main__":
    _common.run(main)
