"""Hub presets: parallel text from FLoRes+ (or the FLORES-200 release) and monolingual text from FineWeb-2 +
FineWeb/DCLM.

Writes the same files as the offline builder: parallel.parquet, mono.parquet, manifest.json.
Param `local_sources` ({flores_plus, flores200, fineweb2, fineweb, dclm}: directory or null, from the
config key of the same name) points at local copies in each hub's own layout (see
`hybridlab.data.local_sources`); null reads the hub, or its snapshot in the HF cache when
HF_HUB_OFFLINE=1. `flores200` set: the parallel text is the FLORES-200 text release.
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
    from hybridlab.errors import HybridlabError

    local = params.get("local_sources") or {}
    unknown = sorted(set(local) - set(hub.LAYOUTS))
    if unknown:
        raise HybridlabError(f"local_sources: unknown dataset keys {unknown}; known: {', '.join(hub.LAYOUTS)}")
    english = params["english"]
    token = os.environ.get("HF_TOKEN")
    split = params.get("flores_split", "devtest")
    par_langs = [english] + [x for x in params["parallel_languages"] if x != english]
    if local.get("flores200"):
        if local.get("flores_plus"):
            raise HybridlabError("local_sources sets both flores_plus and flores200; keep the one parallel source")
        parallel = hub.load_flores200(par_langs, split, local=local["flores200"])
        par_source = str(local["flores200"])
    else:
        parallel = hub.load_flores(par_langs, split, local=local.get("flores_plus"), token=token)
        par_source = str(local.get("flores_plus") or hub.FLORES)
    web = params.get("english_web", "fineweb")
    mono = pl.concat([
        hub.load_fineweb2([x for x in params["mono_languages"] if x != english],
                          params["fineweb2_docs_per_language"], local=local.get("fineweb2"), token=token),
        hub.load_english_web(params["english_web_docs"], source=web, local=local.get(web), token=token),
    ])
    manifest = {
        "source": "hub",
        "datasets": {"parallel": par_source, "mono": str(local.get("fineweb2") or hub.FINEWEB2),
                     "english": str(local.get(web) or hub.HUB_NAMES[web])},
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
