"""The typed config tree (hybridlab.config_spec): the committed JSON Schema is its output, every key has
help text, documented defaults are valid values, and `describe()` renders a section's settings."""

import copy
import dataclasses
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import jsonschema
import pytest
import yaml

from hybridlab import config as cfg
from hybridlab import config_spec as spec
from hybridlab.errors import HybridlabError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "src" / "hybridlab" / "schemas" / "config.schema.json"


@pytest.fixture(scope="module")
def base():
    return cfg.expand_presets(yaml.safe_load((ROOT / "config.yaml").read_text()))


def test_committed_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text() == spec.json_schema_text(), (
        "src/hybridlab/schemas/config.schema.json is stale; regenerate it with "
        "`python -m hybridlab.config_spec > src/hybridlab/schemas/config.schema.json`")


def test_module_cli_prints_the_schema_and_describes():
    out = io.StringIO()
    with redirect_stdout(out):
        assert spec.main([]) == 0
    assert out.getvalue() == spec.json_schema_text()
    out = io.StringIO()
    with redirect_stdout(out):
        assert spec.main(["--describe", "train.bld_sr.model"]) == 0
    assert out.getvalue() == spec.describe("train.bld_sr.model") + "\n"


def test_validation_uses_the_generated_schema():
    assert cfg._schema() == spec.json_schema()
    jsonschema.Draft202012Validator.check_schema(spec.json_schema())
    assert cfg.SCALES == spec.SCALES == ("smoke", "tiny", "paper", "rehearsal", "real")


def test_every_section_and_key_has_one_line_help():
    seen = 0
    for where, f in spec.iter_fields():
        seen += 1
        text = f.metadata.get("help", "")
        assert text.strip() and "\n" not in text, f"{where} has no one-line help"
    assert seen > 200  # the whole tree, nested sections included
    classes = {v for v in vars(spec).values() if dataclasses.is_dataclass(v) and isinstance(v, type)
               and v.__module__.startswith(spec.__name__ + ".") and v not in (spec.Schema, spec.Def, spec.Label)}
    assert len(classes) > 30  # every section class, re-exported from its module
    for c in classes:
        assert (c.__doc__ or "").strip(), f"{c.__name__} has no docstring"


def test_documented_defaults_are_valid_values():
    """Each default passes its own key's schema (a default can never be a value validation rejects)."""
    schema = spec.json_schema()
    n = 0
    for where, f in spec.iter_fields():
        default = f.metadata.get("default", spec.UNSET)
        if default is spec.UNSET:
            continue
        n += 1
        gen = spec._Generator()
        field_schema = gen.field_schema(f)
        errors = list(jsonschema.Draft202012Validator({**field_schema, "$defs": schema["$defs"]})
                      .iter_errors(default))
        assert not errors, f"{where}: default {default!r} is invalid: {errors[0].message}"
    assert n > 30


def test_required_keys_have_no_default_and_optional_ones_do():
    for where, f in spec.iter_fields():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        assert required == ("default" not in f.metadata), where


@pytest.mark.parametrize("scale", cfg.SCALES)
def test_presets_round_trip_through_the_dataclasses(base, scale):
    preset = base["presets"][scale]
    obj = spec.build(f"presets.{scale}", preset)
    assert isinstance(obj, spec.Preset) and isinstance(obj.data, spec.Data)
    # without defaults the dict comes back as written ...
    assert spec.to_dict(obj, with_defaults=False) == _drop_written_defaults(preset, spec.Preset)
    # ... with them it is the written dict plus the documented defaults of absent keys, still valid
    full = spec.to_dict(obj)
    assert _is_superset(full, preset)
    c = copy.deepcopy(base)
    c["presets"][scale] = full
    cfg.validate(c)


def test_experiments_round_trip_and_defaults(base):
    obj = spec.build("experiments", base["experiments"])
    assert obj.distill.conv_init == "identity" and obj.bld_nl.seeds == [0, 1, 2]
    assert spec.to_dict(obj) == base["experiments"]
    assert spec.section_defaults("experiments.distill") == {"conv_init": "identity", "stage1": "shared"}
    assert spec.section_defaults("train.distill.stage1")["schedule"] == "cosine"
    stage = spec.build("train.distill.stage1", {"steps": 3, "micro_batch_size": 1, "lr": 1e-3})
    assert stage.token_budget is spec.UNSET and stage.grad_accum == 1 and stage.precision == "auto"
    assert spec.to_dict(stage, with_defaults=False) == {"steps": 3, "micro_batch_size": 1, "lr": 1e-3}


def _drop_written_defaults(d: dict, cls) -> dict:
    """`d` without keys written at their documented default (what to_dict(with_defaults=False) drops)."""
    out = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k, v in d.items():
        f = fields[k]
        if "default" in f.metadata and v == f.metadata["default"]:
            continue
        child, keyed = spec._child(f.type)
        if child is not None and isinstance(v, dict):
            v = ({n: _drop_written_defaults(x, child) for n, x in v.items()} if keyed
                 else _drop_written_defaults(v, child))
        elif child is not None and isinstance(v, list):
            v = [_drop_written_defaults(x, child) for x in v]
        out[k] = v
    return out


def _is_superset(full, part) -> bool:
    if isinstance(part, dict):
        return isinstance(full, dict) and all(k in full and _is_superset(full[k], v) for k, v in part.items())
    if isinstance(part, list):
        return isinstance(full, list) and len(full) == len(part) and all(map(_is_superset, full, part))
    return full == part


def test_section_paths_of_the_file_and_of_the_resolved_view():
    assert spec.section("") is spec.Config
    assert spec.section("experiments.distill") is spec.DistillExperiment
    assert spec.section("presets.tiny.train.distill") is spec.section("train.distill") is spec.DistillTrain
    assert spec.section("train.bld_nl.sizes.1b") is spec.section("train.bld_nl.sizes") is spec.BldNlSize
    assert spec.section("eval.analysis.hub_pairs") is spec.HubPair
    assert spec.section("presets.tiny.experiments") is spec.PresetExperiments
    with pytest.raises(HybridlabError, match=r"no section 'train\.bogus' \(allowed here: teacher, distill"):
        spec.section("train.bogus")
    with pytest.raises(HybridlabError, match="is a setting, not a section"):
        spec.section("data.seq_len")


def test_describe_renders_a_section():
    assert spec.describe("experiments.bld_nl") == "\n".join([
        "experiments.bld_nl: BLD on natural language: baseline and BLD arm of each mixer and size.",
        "  mixers: list of (gdn | kda | gla); at least 1 item, distinct  [required]",
        "      recurrent mixers (one baseline and one BLD arm each)",
        "  pattern: list of (full_attention | mixer); at least 1 item  [required]",
        "      layer i is pattern[i % len(pattern)]",
        "  freeze_fraction: number in (0, 1)  [required]",
        "      BLD freezes the recurrent layers for this fraction of the updates",
        "  optimizer_after_unfreeze: one of adamw | muon  [required]",
        "      optimiser of both arms after the unfreeze update",
        "  freeze_scope: one of mixer | block  [required]",
        "      block: whole recurrent decoder layers; mixer: their token mixers only",
        "  seeds: list of distinct integers >= 0 (at least 1)  [optional]",
        "      replicate seeds: every arm runs once per seed (a `seed` wildcard, one job each); within one seed "
        "all arms share the data order and the initial weights they have in common; absent: one run with the "
        "top-level seed",
    ])
    text = spec.describe("train.distill")
    assert "  teacher_sharding: one of replicate | shard  [default \"replicate\"]" in text
    assert "  stage1: section (describe train.distill.stage1)  [required]" in text
    assert "  table_rows_per_language: integer or null; >= 1  [required]" in text
    # re-exported where scripts already import the config module
    assert cfg.describe("train.distill") == text
