"""Paper preset: parallel text from FLoRes+ and monolingual text from FineWeb-2 + FineWeb/DCLM (the hub).

Writes the same files as the offline builder: parallel.parquet, mono.parquet, manifest.json.
Optional params `flores_path`, `fineweb2_path`, `english_web_path` point at local copies in the hub
layout (`<dir>/<config>/<split>.parquet`), e.g. a mirror on a cluster without internet.
"""

import json
import os
from pathlib import Path

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--cache", help="unused by the hub source (datasets keeps its own cache)")
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import polars as pl

    from hybridlab.data import hub

    english = params["english"]
    token = os.environ.get("HF_TOKEN")
    flores = params.get("flores_path") or hub.FLORES
    parallel = hub.load_flores([english] + [x for x in params["parallel_languages"] if x != english],
                               params.get("flores_split", "devtest"), path_or_name=flores, token=token)
    mono_langs = [x for x in params["mono_languages"] if x != english]
    mono = pl.concat([
        hub.load_fineweb2(mono_langs, params["fineweb2_docs_per_language"],
                          path_or_name=params.get("fineweb2_path") or hub.FINEWEB2, token=token),
        hub.load_english_web(params["english_web_docs"], source=params.get("english_web", "fineweb"),
                             path_or_name=params.get("english_web_path"), token=token),
    ])
    manifest = {
        "source": "hub",
        "datasets": {"parallel": str(flores), "mono": str(params.get("fineweb2_path") or hub.FINEWEB2),
                     "english": params.get("english_web", "fineweb")},
        "parallel": parallel.group_by("lang").len().sort("lang").rows(),
        "mono_docs": mono.group_by("lang").len().sort("lang").rows(),
        "unavailable": {},
        "config": params,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, df in (("parallel", parallel), ("mono", mono)):
        tmp = out / f".{name}.parquet.tmp"
        df.write_parquet(tmp)
        tmp.replace(out / f"{name}.parquet")
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    tmp.replace(out / "manifest.json")
    print(f"parallel: {parallel.height} rows; mono: {mono.height} docs")


if __name__ == "__main__":
    _common.run(main)
