"""Configuration: load `config.yaml`, validate it once, resolve the active scale preset.

The config declares every experiment once; `presets.<scale>` only changes sizes. A preset may derive from
another and state only what differs (`expand_presets`); validation sees every preset written out in full.
Validation is two passes, both ending in a one-line `HybridlabError` that names the offending key and what is
allowed:

1. structure and types against the JSON Schema (2020-12) generated from the typed config tree in
   `hybridlab.config_spec` (dataclasses: types, allowed values, ranges, defaults, help per key; unknown
   keys are errors, never silently ignored). `schemas/config.schema.json` is that schema, committed
   for editors and readers; regenerate it with
   `python -m hybridlab.config_spec > src/hybridlab/schemas/config.schema.json`;
2. meaning: language codes exist in the registry, gap weights match gaps, head counts divide, the
   full-attention ratio leaves at least one attention layer in the teacher, ...

`resolve(config)` returns the flat view rules and scripts use (`cfg["data"]["seq_len"]`, ...), and
`config_hash` a short stable hash of that view for provenance and cache keys.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from hybridlab import config_spec
from hybridlab.config_spec import SCALES, describe  # noqa: F401  (re-exported)
from hybridlab.config_spec.validate import format_error
from hybridlab.errors import HybridlabError


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    return config_spec.json_schema()


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema())


def _check_structure(config: dict) -> None:
    validator = _validator()

    def check(cfg: dict, prefix: str = "") -> None:
        errors = sorted(validator.iter_errors(cfg), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
        if errors:
            # The deepest error is the most specific one (an unknown key beats "not valid under any schema").
            err = max(errors, key=lambda e: len(e.absolute_path))
            raise HybridlabError(prefix + format_error(err))

    check(config)
    # A preset may narrow an experiment's arm lists (the rehearsal does); the merged experiments must be valid.
    for scale, preset in config["presets"].items():
        if preset.get("experiments"):
            check({**config, "experiments": merged_experiments(config, scale)},
                  f"presets.{scale}.experiments overrides: ")


def merged_experiments(config: dict, scale: str) -> dict:
    """`experiments` with the preset's per-experiment overrides (`presets.<scale>.experiments`) applied."""
    over = config["presets"][scale].get("experiments") or {}
    return {name: {**exp, **over.get(name, {})} for name, exp in config["experiments"].items()}


def _check_meaning(config: dict) -> None:
    from hybridlab.data.languages import get_language

    langs = config["languages"]
    checks: list[tuple[str, str]] = [("languages.english", langs["english"])]
    checks += [(f"languages.{k}[{i}]", c) for k in ("flores_paper", "fineweb2_project")
               for i, c in enumerate(langs[k])]
    for scale, preset in config["presets"].items():
        for k in ("parallel_languages", "mono_languages"):
            checks += [(f"presets.{scale}.data.{k}[{i}]", c) for i, c in enumerate(preset["data"][k])]
    for where, code in checks:
        try:
            get_language(code)
        except HybridlabError as exc:
            raise HybridlabError(f"config: {where}: {exc}") from None
    # hub presets: every language exists in each dataset it is read from (FLoRes+/FLORES-200, FineWeb-2)
    from hybridlab.data.local_sources import check_hub_languages

    check_hub_languages(config)

    for scale in config["presets"]:
        distill = merged_experiments(config, scale)["distill"]
        own = distill.get("placement_seeds") or {}
        first = (distill.get("seeds") or [config["seed"]])[0]
        lacking = sorted(p for p, seeds in own.items() if first not in seeds)
        if lacking:
            raise HybridlabError(f"config: presets.{scale}.experiments.distill.placement_seeds of {lacking} lack seed "
                                 f"{first}, the first distillation seed (the analyses read its models); add it")
        extra = sorted(set(own) - set(distill["placements"]))
        if extra:
            raise HybridlabError(f"config: presets.{scale}.experiments.distill.placement_seeds names {extra}, which "
                                 f"are not placements of the experiment ({', '.join(distill['placements'])})")
        _check_searched(config, scale, distill["placements"])
        _check_shared_stage1(config["presets"][scale], scale, distill)
        gguf = sorted(set(config["presets"][scale]["models"].get("gguf") or {})
                      - set(config["presets"][scale]["models"].get("teachers") or []))
        if gguf:
            raise HybridlabError(f"config: presets.{scale}.models.gguf names {gguf}, which are not in "
                                 "models.teachers; list each GGUF teacher there")
    for scale, preset in config["presets"].items():
        heldout = preset["data"].get("heldout")
        if heldout:
            absent = [x for x in heldout["languages"] if x not in preset["data"]["parallel_languages"]
                      and x != langs["english"]]
            if absent:
                raise HybridlabError(f"config: presets.{scale}.data.heldout.languages {absent} are not in "
                                     "data.parallel_languages (the held-out text is the parallel corpus); add them")
            if preset["data"]["source"] != "hub":
                raise HybridlabError(f"config: presets.{scale}.data.heldout is for hub presets; remove it")
        sr_run = (preset.get("train") or {}).get("bld_sr")
        if sr_run:
            try:
                _check_bld_sr(merged_experiments(config, scale)["bld_sr"], sr_run["steps"])
            except HybridlabError as exc:
                raise HybridlabError(f"config: presets.{scale}: experiments.bld_sr.{exc}") from None
        sr = preset["data"]["spaced_retrieval"]
        if len(sr["gaps"]) != len(sr["gap_weights"]):
            raise HybridlabError(
                f"config: presets.{scale}.data.spaced_retrieval: gaps has {len(sr['gaps'])} entries but "
                f"gap_weights has {len(sr['gap_weights'])}; give one weight per gap")
        models = preset["models"]
        if preset["data"]["source"] == "offline" and "teacher" not in models:
            raise HybridlabError(f"config: presets.{scale}.models.teacher is required for an offline preset "
                                 f"(the teacher is pre-trained from this local shape)")
        if preset["data"]["source"] == "hub" and "teachers" not in models:
            raise HybridlabError(f"config: presets.{scale}.models.teachers is required for a hub preset "
                                 f"(list Hugging Face model names or local paths)")
        t = models.get("teacher")
        if t:
            if t["num_attention_heads"] % t["num_key_value_heads"]:
                raise HybridlabError(
                    f"config: presets.{scale}.models.teacher.num_attention_heads ({t['num_attention_heads']}) "
                    f"must be a multiple of num_key_value_heads ({t['num_key_value_heads']})")
            n_fa = round(t["num_hidden_layers"] * config["experiments"]["distill"]["fa_ratio"])
            if not 1 <= n_fa <= t["num_hidden_layers"]:
                raise HybridlabError(
                    f"config: experiments.distill.fa_ratio={config['experiments']['distill']['fa_ratio']} gives "
                    f"{n_fa} full-attention layers of {t['num_hidden_layers']} at scale '{scale}'; choose a ratio "
                    f"giving 1..{t['num_hidden_layers']}")


def _check_bld_sr(experiment: dict, steps: int) -> None:
    """Config checks of `experiments.bld_sr` against a run of `steps` updates (one-line errors): update
    freeze windows start before the run's end and end by it, score updates lie within it."""
    for s in experiment.get("freeze_until_updates") or []:
        if s >= steps:
            raise HybridlabError(f"freeze_until_updates has {s}, not before the run's end at {steps} updates "
                                 "(train.bld_sr.steps); lower it or train longer")
    for s, w in experiment.get("freeze_windows_updates") or []:
        if w < 1 or s + w > steps:
            raise HybridlabError(f"freeze_windows_updates has [{s}, {w}]: a window of w >= 1 updates from update "
                                 f"s must end by the run's {steps} updates (train.bld_sr.steps); fix s or w")
    for u in experiment.get("score_updates") or []:
        if u > steps:
            raise HybridlabError(f"score_updates has {u}, past the run's {steps} updates (train.bld_sr.steps); "
                                 "lower it or train longer")


SEEDED_EXPERIMENTS = ("distill", "bld_sr", "bld_nl")


def _check_seeds(config: dict) -> None:
    """`experiments.<name>.seeds` (and preset overrides): a non-empty list of distinct integers >= 0.

    Checked before the schema so a bad value gets a message with the fix, not a generic schema error."""
    places = [(f"experiments.{name}", (config.get("experiments") or {}).get(name)) for name in SEEDED_EXPERIMENTS]
    for scale, preset in (config.get("presets") or {}).items():
        over = (preset or {}).get("experiments") if isinstance(preset, dict) else None
        places += [(f"presets.{scale}.experiments.{name}", (over or {}).get(name)) for name in SEEDED_EXPERIMENTS]
    for where, exp in places:
        if not isinstance(exp, dict) or "seeds" not in exp:
            continue
        seeds = exp["seeds"]
        fix = "give a non-empty list of distinct integers >= 0, e.g. seeds: [0, 1, 2]"
        if not isinstance(seeds, list) or not seeds:
            raise HybridlabError(f"config: {where}.seeds = {seeds!r} is not a non-empty list; {fix}")
        bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or s < 0]
        if bad:
            raise HybridlabError(f"config: {where}.seeds has {bad[0]!r}, not an integer >= 0; {fix}")
        dup = sorted({s for s in seeds if seeds.count(s) > 1})
        if dup:
            raise HybridlabError(f"config: {where}.seeds lists seed {dup[0]} twice (replicates must differ); {fix}")


def experiment_seeds(cfg: dict, name: str) -> list[int]:
    """Replicate seeds of experiment `name` in a resolved view (`resolve`): its `seeds`, else [cfg["seed"]]."""
    return list(cfg["experiments"][name].get("seeds") or [cfg["seed"]])


def placement_seeds(cfg: dict, placement: str) -> list[int]:
    """Replicate seeds of one distillation placement: `experiments.distill.placement_seeds[placement]`, else
    the experiment's seeds."""
    own = (cfg["experiments"]["distill"].get("placement_seeds") or {}).get(placement)
    return list(own or experiment_seeds(cfg, "distill"))


def studies(cfg: dict) -> list[str]:
    """The studies a resolved preset runs (`presets.<scale>.studies`; default both)."""
    return list(cfg.get("studies") or ["multilinguality", "bld"])



def _check_searched(config: dict, scale: str, placements: list[str]) -> None:
    """A searched placement needs the preset's layer importance settings, with a parallel language of its group."""
    from hybridlab.data.languages import language_group
    from hybridlab.models.placements import searched_group

    groups = [g for g in map(searched_group, placements) if g is not None]
    if not groups:
        return
    preset = config["presets"][scale]
    section = (preset.get("eval") or {}).get("layer_importance")
    if section is None:
        raise HybridlabError(f"config: presets.{scale} runs searched placements but has no eval.layer_importance; "
                             "add it (languages, sentences, batch_size) or drop the searched placements")
    english = config["languages"]["english"]
    absent = [x for x in section["languages"] if x not in preset["data"]["parallel_languages"] and x != english]
    if absent:
        raise HybridlabError(f"config: presets.{scale}.eval.layer_importance.languages {absent} are not in "
                             "data.parallel_languages (its sentences come from the parallel corpus); add them")
    have = {language_group(x, english) for x in [english, *section["languages"]]} | {"all"}
    for g in groups:
        if g not in have:
            raise HybridlabError(f"config: presets.{scale} runs searched_{g} but eval.layer_importance.languages has "
                                 f"no {g} language; add one")

def _check_shared_stage1(preset: dict, scale: str, distill: dict) -> None:
    """A shared stage 1 trains each layer as a placement's own would only with teacher inputs and no global clip."""
    train = (preset.get("train") or {}).get("distill")
    if distill.get("stage1", "shared") != "shared" or not train:
        return
    where = f"config: presets.{scale}"
    if train.get("stage1_inputs") != "teacher":
        raise HybridlabError(f"{where}.train.distill.stage1_inputs is {train.get('stage1_inputs')!r}, but a shared "
                             "stage 1 feeds every mixer the teacher's inputs; set experiments.distill.stage1: "
                             "per_placement for student inputs")
    if train["stage1"].get("grad_clip", 1.0) is not None:
        raise HybridlabError(f"{where}.train.distill.stage1.grad_clip couples the layers of a shared stage 1 "
                             "(one global norm); set it to null, or experiments.distill.stage1: per_placement")


DERIVES_FROM, UNSET = "derives_from", "unset"


def expand_presets(config: dict) -> dict:
    """`config` with every derived preset written out in full (a shallow copy; the input is not changed).

    A preset that states `derives_from: <name>` starts from that preset (itself expanded first). Its
    `unset: [path, ...]` removes inherited keys: dotted paths such as `train.bld_nl.sizes`, matched against the
    inherited keys, so a key that holds a dot (`sizes.1.4m`) is named the same way. Its own keys then merge
    over what is left: a mapping key by key, anything else (a list, a number, null) replaces the inherited value.
    """
    presets = config.get("presets") if isinstance(config, dict) else None
    if not isinstance(presets, dict) or not any(isinstance(p, dict) and ({DERIVES_FROM, UNSET} & set(p))
                                                for p in presets.values()):
        return config
    done: dict[str, Any] = {}

    def expand(name: str, chain: tuple[str, ...]) -> Any:
        if name in done:
            return done[name]
        preset = presets[name]
        where = f"config: presets.{name}"
        if not isinstance(preset, dict) or DERIVES_FROM not in preset:
            if isinstance(preset, dict) and UNSET in preset:
                raise HybridlabError(f"{where}.{UNSET} removes inherited keys, but the preset derives from none; "
                                     f"add {DERIVES_FROM}: <preset> or remove {UNSET}")
            done[name] = preset
            return preset
        parent = preset[DERIVES_FROM]
        if not isinstance(parent, str) or parent not in presets or parent == name:
            others = ", ".join(p for p in presets if p != name)
            raise HybridlabError(f"{where}.{DERIVES_FROM} = {parent!r} is not another preset of this config; "
                                 f"name one of {others}")
        if parent in chain:
            loop = " -> ".join((*chain[chain.index(parent):], name, parent))
            raise HybridlabError(f"{where}.{DERIVES_FROM}: the presets derive in a loop ({loop}); let one of them "
                                 "state its keys in full")
        base = copy.deepcopy(expand(parent, (*chain, name)))
        if not isinstance(base, dict):
            raise HybridlabError(f"config: presets.{parent} is not a mapping, so presets.{name} cannot derive "
                                 "from it; write it as `key: value` lines")
        unset = preset.get(UNSET, [])
        if not isinstance(unset, list) or not all(isinstance(path, str) for path in unset):
            raise HybridlabError(f"{where}.{UNSET} = {unset!r} is not a list of dotted key paths; write e.g. "
                                 f"{UNSET}: [train.bld_nl.sizes]")
        for path in unset:
            _pop_path(base, path, f"{where}.{UNSET}", parent)
        done[name] = _merge(base, {k: v for k, v in preset.items() if k not in (DERIVES_FROM, UNSET)})
        return done[name]

    return {**config, "presets": {name: expand(name, ()) for name in presets}}


def _pop_path(tree: dict, path: str, where: str, parent: str) -> None:
    node, rest = tree, path
    while isinstance(node, dict):
        # the longest key the rest of the path starts with, so keys holding a dot are matched whole
        key = max((k for k in node if rest == str(k) or rest.startswith(f"{k}.")), key=lambda k: len(str(k)),
                  default=None)
        if key is None:
            break
        if rest == str(key):
            del node[key]
            return
        node, rest = node[key], rest[len(str(key)) + 1:]
    raise HybridlabError(f"{where} names {path!r}, which presets.{parent} does not set; fix the path or remove it")


def _merge(base: dict, own: dict) -> dict:
    for key, value in own.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def validate(config: dict) -> dict:
    """Validate a raw config dict (as Snakemake sees it, `--config` overrides merged); return it.

    Derived presets are expanded in place (`config["presets"]` is replaced by the written-out presets)."""
    if not isinstance(config, dict) or not config:
        raise HybridlabError("config: empty or not a mapping; start from the repository's config.yaml")
    if "presets" in config:
        config["presets"] = expand_presets(config)["presets"]
    _check_seeds(config)
    _check_structure(config)
    _check_meaning(config)
    return config


def load(path: str | Path = "config.yaml", overrides: dict | None = None) -> dict:
    """Read a YAML config, apply top-level overrides (like `--config scale=smoke`), validate it."""
    path = Path(path)
    if not path.exists():
        raise HybridlabError(f"config: {path} not found; run from the repository root or pass --configfile")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        raise HybridlabError(f"config: {path} is not valid YAML (line {line + 1 if line is not None else '?'}); "
                             f"fix the syntax") from None
    config = copy.deepcopy(config or {})
    config.update(overrides or {})
    return validate(config)


def resolve(config: dict) -> dict:
    """The flat view of the active preset: languages, experiments, seed, scale + the preset's sections."""
    config = expand_presets(config)
    scale = config["scale"]
    view = {
        "scale": scale,
        "seed": config["seed"],
        "languages": config["languages"],
        "offline": config["offline"],
    }
    view.update(copy.deepcopy(config["presets"][scale]))
    view["experiments"] = copy.deepcopy(merged_experiments(config, scale))
    return view


def config_hash(obj: Any) -> str:
    """A short, stable hash of any JSON-serialisable config subset."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
