"""Local copies in each hub's exact layout (FLoRes+, FLORES-200, FineWeb-2, FineWeb, DCLM) from a corpus.

Reads the corpus step's parallel.parquet and mono.parquet (the offline corpus) and writes, under
--out, the directories `hybridlab.data.hub_layout` describes; point a preset's `local_sources` at them
(`<out>/flores_plus`, `<out>/fineweb-2`, ...) to run the hub loaders without the hub.
"""

import json

import _common


def main() -> None:
    from hybridlab.config_spec import HubLayoutJob

    p = _common.parser(__doc__, HubLayoutJob)
    p.add_argument("--parallel", required=True, help="parallel.parquet (sid, lang, text, source)")
    p.add_argument("--mono", required=True, help="mono.parquet (doc_id, lang, text, source)")
    p.add_argument("--out", required=True, help="output directory (replaced)")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.data import hub_layout_job

    dirs = hub_layout_job(_common.load_job(HubLayoutJob, args.params), parallel=args.parallel, mono=args.mono,
                          out=args.out)
    print(json.dumps(dirs, sort_keys=True))


if __name__ == "__main__":
    _common.run(main)
