"""Local copies instead of the Hugging Face hub: datasets, models, and the HF cache in offline mode.

Clusters often have no hub access; researchers keep local copies. A preset's optional
``local_sources`` section (all keys optional; absent or null = read the hub) names them:

=============== =========================================================================================
key             what it points at (each in its hub's own layout, config names and columns)
=============== =========================================================================================
``flores_plus`` FLoRes+ parquet mirror: ``{dev,devtest}/<config>.parquet``, column ``text`` (+ ``id``)
``flores200``   FLORES-200 text release: ``{dev,devtest}/<code>.{dev,devtest}[.xz]``, a sentence a line
``fineweb2``    FineWeb-2: ``data/<config>/train/*.parquet``, columns ``text``, ``id``
``fineweb``     FineWeb: ``sample/10BT/*.parquet`` (config ``sample-10BT``) or ``data/<dump>/*.parquet``
``dclm``        DCLM-baseline: ``global-shard_*/local-shard_*/*.jsonl.zst`` (or ``.jsonl``), field ``text``
``ntrex128``    NTREX-128 (shipped: ``data/ntrex128``): ``newstest2019-ref.<name>.txt[.xz]``, a sentence a line
``pg19``        PG-19 books (position loss): ``data/<split>-*.parquet``, columns ``text``, ``url`` (+ metadata)
``models``      mapping hub model id -> local directory (teachers, tokenizers, analysis-pair models)
``hf_home``     ``HF_HOME`` for every job (the Hugging Face cache: hub snapshots, datasets cache)
``hf_offline``  true: ``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1`` for every job
=============== =========================================================================================

``flores_plus`` and ``flores200`` are alternatives (one parallel source); so are ``fineweb2`` and
``ntrex128`` (one monolingual source: with ``ntrex128`` the monolingual text, English included, is
NTREX-128). With ``hf_offline`` and no local directory for a dataset, the loaders read the dataset's
snapshot in the HF cache (same layout).

The rules export :func:`job_environment` into every job's environment; model loaders call
:func:`resolve_model_source`, which reads the mapping from the config or from that environment.
:func:`check_hub_languages` runs at config validation: every language of a hub preset must exist in
every dataset the preset reads it from, else one line names the dataset and the language.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hybridlab.data.languages import DATASETS, dataset_config
from hybridlab.errors import HybridlabError

DATASET_KEYS = ("flores_plus", "flores200", "fineweb2", "fineweb", "dclm", "ntrex128")  # read by the corpus step
EVAL_DATASET_KEYS = ("pg19",)  # read by evaluation rules only (kept out of the corpus step's params)
KEYS = (*DATASET_KEYS, *EVAL_DATASET_KEYS, "models", "hf_home", "hf_offline")
MODEL_DIRS_ENV = "HYBRIDLAB_MODEL_DIRS"  # JSON {hub id: local dir}, set for every job by the rules


def local_sources(view: dict) -> dict[str, Any]:
    """The `local_sources` of a resolved preset view (or of a preset), every key present (None/{}/False)."""
    given = view.get("local_sources") or {}
    out: dict[str, Any] = {k: given.get(k) for k in (*DATASET_KEYS, *EVAL_DATASET_KEYS, "hf_home")}
    out["models"] = dict(given.get("models") or {})
    out["hf_offline"] = bool(given.get("hf_offline", False))
    return out


# Presets whose local copies a make target writes just before their DAG runs (`make rehearsal`: cache/rehearsal),
# so their paths are not checked when the DAG is parsed.
WRITTEN_BEFORE_THE_DAG = frozenset({"rehearsal"})


def check_paths(view: dict, root: str | Path = ".") -> None:
    """One-line HybridlabError for the first configured local copy (dataset or model directory) of the active
    preset that does not exist (relative paths from `root`, the repository); presets in WRITTEN_BEFORE_THE_DAG
    are not checked."""
    if view.get("scale") in WRITTEN_BEFORE_THE_DAG:
        return
    src = local_sources(view)
    given = [(k, src[k]) for k in (*DATASET_KEYS, *EVAL_DATASET_KEYS) if src[k]]
    given += [(f"models.{hub_id}", d) for hub_id, d in src["models"].items()]
    for key, path in given:
        if not (Path(root) / Path(path).expanduser()).exists():
            raise HybridlabError(
                f"config: presets.{view.get('scale')}.local_sources.{key}: {path} does not exist; copy it there "
                f"(in its hub's layout, docs/data.md) or remove the key to read the hub")


def job_environment(view: dict) -> dict[str, str]:
    """Environment variables every job of this preset gets (empty when nothing is local)."""
    src = local_sources(view)
    env: dict[str, str] = {}
    if src["hf_home"]:
        env["HF_HOME"] = str(Path(src["hf_home"]).expanduser().absolute())
    if src["hf_offline"]:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if src["models"]:
        env[MODEL_DIRS_ENV] = json.dumps(src["models"], sort_keys=True)
    return env


def _model_dirs(cfg: dict | None) -> dict[str, str]:
    if cfg is not None:
        # a view or preset carries `local_sources` (its own `models` key is the model shapes), else
        # `cfg` is the local_sources section itself
        section = cfg.get("local_sources") if "local_sources" in cfg or not set(cfg) <= set(KEYS) else cfg
        return dict((section or {}).get("models") or {})
    text = os.environ.get(MODEL_DIRS_ENV)
    if not text:
        return {}
    try:
        dirs = json.loads(text)
    except json.JSONDecodeError:
        raise HybridlabError(f"{MODEL_DIRS_ENV} is not JSON ({text[:80]!r}); set local_sources.models in "
                             f"config.yaml instead of the variable") from None
    if not isinstance(dirs, dict):
        raise HybridlabError(f"{MODEL_DIRS_ENV} must be a JSON object {{hub id: directory}}, got {text[:80]!r}")
    return dirs


def resolve_model_source(hub_id, cfg: dict | None = None):
    """The local directory mapped to `hub_id` by `local_sources.models`, else `hub_id` unchanged.

    `cfg` is a resolved preset view, a preset, or a `local_sources` dict; None reads the mapping the
    rules exported to the job (``HYBRIDLAB_MODEL_DIRS``). A mapped directory must exist: a missing
    one is a one-line error, never a silent fall-back to the hub.
    """
    dirs = _model_dirs(cfg)
    key = os.fspath(hub_id) if isinstance(hub_id, (str, os.PathLike)) else hub_id
    if not isinstance(key, str) or key not in dirs:
        return hub_id
    path = Path(dirs[key]).expanduser()
    if not path.is_dir():
        raise HybridlabError(f"local_sources.models maps '{key}' to '{path}', which is not a directory; "
                             f"copy the model there (save_pretrained / huggingface-cli download --local-dir) "
                             f"or remove the entry")
    return str(path)


def _title(dataset: str) -> str:
    return DATASETS[dataset][0]


def check_hub_languages(config: dict) -> None:
    """Every language of every hub preset resolves in each dataset that preset reads it from.

    Parallel languages + English: FLoRes+ (or the FLORES-200 release when `local_sources.flores200`
    is set). Monolingual languages except English: FineWeb-2 (English comes from FineWeb/DCLM); with
    `local_sources.ntrex128` set, monolingual languages and English: NTREX-128. Two
    project languages that one dataset stores under the same config (FineWeb-2's `cmn_Hani` for
    `zho_Hans` and `zho_Hant`) are an error too: they would load the same documents twice.
    """
    english = config["languages"]["english"]
    for scale, preset in config["presets"].items():
        data = preset["data"]
        if data["source"] != "hub":
            continue
        src = local_sources(preset)
        if src["flores_plus"] and src["flores200"]:
            raise HybridlabError(f"config: presets.{scale}.local_sources sets both flores_plus and flores200; "
                                 f"keep the one parallel source to read")
        if src["fineweb2"] and src["ntrex128"]:
            raise HybridlabError(f"config: presets.{scale}.local_sources sets both fineweb2 and ntrex128; "
                                 f"keep the one monolingual source to read")
        parallel = "flores200" if src["flores200"] else "flores_plus"
        mono = [c for c in data["mono_languages"] if c != english]
        # NTREX-128 also supplies the English text; FineWeb-2 has none (English comes from FineWeb/DCLM)
        mono_dataset, mono_codes = ("ntrex128", mono + [english]) if src["ntrex128"] else ("fineweb2", mono)
        lists = [("parallel_languages", parallel, [english] + [c for c in data["parallel_languages"] if c != english]),
                 ("mono_languages", mono_dataset, mono_codes)]
        for key, dataset, codes in lists:
            seen: dict[str, str] = {}
            for code in codes:
                try:
                    name = dataset_config(code, dataset)
                except HybridlabError as exc:
                    raise HybridlabError(f"config: presets.{scale}.data.{key}: {exc}") from None
                if name in seen:
                    raise HybridlabError(
                        f"config: presets.{scale}.data.{key}: {seen[name]} and {code} are the same config "
                        f"'{name}' in {_title(dataset)}; keep one of them")
                seen[name] = code
