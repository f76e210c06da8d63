"""Validation messages and job sections: a JSON Schema error as one line naming the key and what is allowed, and
`job_settings`, a rule's `--params` checked against its typed section and built into it.

Here, below every layer of the library, so that any job function (a data, training or evaluation job) can type its
parameters without importing the config loader (`hybridlab.config`, which checks meaning against the language
registry and the placements).
"""

from __future__ import annotations

import functools

import jsonschema

from hybridlab.config_spec.schema import dataclass_json_schema
from hybridlab.config_spec.sections import build_section
from hybridlab.errors import HybridlabError


def _path_str(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _allowed(schema: dict) -> str:
    return ", ".join(map(str, schema.get("enum", [])))


def format_error(err: jsonschema.ValidationError, prefix: str = "config: ") -> str:
    where = _path_str(err.absolute_path)
    v, inst, sch = err.validator, err.instance, err.schema
    if v == "additionalProperties":
        known = sorted(sch.get("properties", {}))
        extra = sorted(set(inst) - set(known))
        key = f"{where}.{extra[0]}" if err.absolute_path else extra[0]
        return f"{prefix}unknown key '{key}' (allowed here: {', '.join(known)})"
    if v == "required":
        missing = [k for k in sch["required"] if k not in inst]
        return f"{prefix}missing key '{missing[0]}' in {where} (required: {', '.join(sch['required'])})"
    if v == "enum":
        return f"{prefix}{where} = {inst!r} is not allowed (allowed: {_allowed(sch)})"
    if v == "pattern" and "[a-z]{3}_" in sch["pattern"]:
        return (f"{prefix}{where} = {inst!r} is not a language code; use ISO 639-3 + '_' + ISO 15924 "
                f"script, e.g. 'tel_Telu'")
    if v == "type":
        return f"{prefix}{where} must be of type {sch['type']}, got {type(inst).__name__} {inst!r}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        return f"{prefix}{where} = {inst!r} is out of range ({v} {sch[v]})"
    if v == "uniqueItems":
        return f"{prefix}{where} has duplicate entries: {inst!r}"
    if v in ("minItems", "maxItems"):
        return f"{prefix}{where} has {len(inst)} items ({v} {sch[v]})"
    return f"{prefix}{where}: {err.message}"


@functools.lru_cache(maxsize=None)
def _job_validator(cls) -> jsonschema.Draft202012Validator:
    validator = jsonschema.Draft202012Validator
    return validator(dataclass_json_schema(cls), format_checker=validator.FORMAT_CHECKER)


_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _field_problem(err: jsonschema.ValidationError) -> str:
    """`name=value: what is allowed` for one bad field of a flat section."""
    where = _path_str(err.absolute_path)
    v, inst, sch = err.validator, err.instance, err.schema
    if v == "enum":
        return f"{where}={inst!r}: must be one of {tuple(x for x in sch['enum'] if x is not None)}"
    if v in _BOUNDS:
        return f"{where}={inst!r}: must be {_BOUNDS[v]} {sch[v]}"
    if v == "type":
        return f"{where}={inst!r}: must be of type {sch['type']}"
    if v == "format":
        return f"{where}: {inst!r} is not a valid regular expression"
    if v in ("minItems", "maxItems"):
        return f"{where}={inst!r}: must have {sch[v]} items"
    if v == "additionalProperties":
        return f"unknown key {sorted(set(inst) - set(sch.get('properties', {})))}"
    return f"{where}: {err.message}"


def field_problems(cls, data: dict) -> list[str]:
    """Every field of `data` that section `cls` does not allow, one `name=value: what is allowed` each (a
    section built in code, e.g. the training loop's config, reports them all in one line)."""
    return [_field_problem(e) for e in sorted(_job_validator(cls).iter_errors(data), key=lambda e: [str(x) for x in e.path])]


def job_settings(cls, params: dict, what: str):
    """A job's typed section (`hybridlab.config_spec.job_sections`) built from its rule's `--params`, after
    checking them against the section: an unknown or missing key or a wrong value is one line naming it.
    A section already built is returned as it is."""
    if isinstance(params, cls):
        return params
    if not isinstance(params, dict):
        raise HybridlabError(f"{what}: --params must be a JSON object")
    errors = list(_job_validator(cls).iter_errors(params))
    if errors:
        err = max(errors, key=lambda e: len(e.absolute_path))
        raise HybridlabError(format_error(err, f"{what} --params: ") + f"; see {what} --help")
    return build_section(cls, params)
