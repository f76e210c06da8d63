"""Config sections by dotted path: look-up, documented defaults, building a section's dataclass from a
config dict and back, `describe()` for a script's `--help`, and the `python -m hybridlab.config_spec` CLI."""

import dataclasses
import json
import sys
import typing
from typing import Any, Literal

from hybridlab.config_spec.fields import UNSET, Label, Schema
from hybridlab.config_spec.schema import _PLAIN, _doc, _is_required, _is_union, _unwrap, json_schema_text
from hybridlab.config_spec.tree import Config, Preset
from hybridlab.errors import HybridlabError


# Sections of the resolved view (`hybridlab.config.resolve`) that come from the active preset.
_PRESET_SECTIONS = {f.name for f in dataclasses.fields(Preset)} - {"experiments"}


def _child(tp):
    """The dataclass a path step descends into from a field of type `tp` (through lists, maps, None)."""
    base, _ = _unwrap(tp)
    if dataclasses.is_dataclass(base):
        return base, False
    if _is_union(base):
        for a in typing.get_args(base):
            if a is not type(None):
                return _child(a)
    origin = typing.get_origin(base)
    if origin is list:
        return _child(typing.get_args(base)[0])
    if origin is dict:
        inner, _ = _child(typing.get_args(base)[1])
        return inner, inner is not None
    return None, False


def section(path: str = ""):
    """The dataclass of a config section, by dotted path.

    Paths are those of config.yaml (`presets.tiny.train.distill`, `experiments.bld_sr`) or of the resolved
    view scripts read (`train.distill`, `data.spaced_retrieval`, `eval.analysis.niah`); a step into a
    mapping of named sections takes any name (`train.bld_nl.sizes.1b`)."""
    parts = [p for p in path.split(".") if p]
    cls = Preset if parts and parts[0] in _PRESET_SECTIONS else Config
    i = 0
    while i < len(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        part = parts[i]
        if part not in fields:
            raise HybridlabError(f"config: no section '{'.'.join(parts[:i + 1])}' (allowed here: "
                                 f"{', '.join(fields)})")
        child, keyed = _child(fields[part].type)
        if child is None:
            raise HybridlabError(f"config: '{'.'.join(parts[:i + 1])}' is a setting, not a section")
        cls = child
        i += 2 if keyed and i + 1 < len(parts) else 1
    return cls


def section_defaults(path: str) -> dict:
    """The documented defaults of a section's optional keys (keys without a default are left out)."""
    cls = section(path)
    out = {}
    for f in dataclasses.fields(cls):
        default = f.metadata.get("default", UNSET)
        if not _is_required(f) and default is not UNSET:
            out[f.name] = json.loads(json.dumps(default))
    return out


def build(path: str, data: dict):
    """A section's dataclass instance from a validated config dict: nested sections built too, absent
    optional keys at their defaults (`UNSET` where they have none)."""
    return _build(section(path), data)


def build_section(cls, data: dict):
    """`build` for a section given by its dataclass (a job's section, `job_sections`)."""
    return _build(cls, data)


def _build(cls, data: dict):
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        kwargs[f.name] = _build_value(f.type, data[f.name])
    return cls(**kwargs)


def _build_value(tp, value):
    base, _ = _unwrap(tp)
    if value is None:
        return None
    if dataclasses.is_dataclass(base):
        return _build(base, value)
    if _is_union(base):
        inner = [a for a in typing.get_args(base) if a is not type(None)]
        return _build_value(inner[0], value) if len(inner) == 1 else value
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is list:
        return [_build_value(args[0], v) for v in value]
    if origin is dict:
        return {k: _build_value(args[1], v) for k, v in value.items()}
    return value


def to_dict(obj, *, with_defaults: bool = True) -> dict:
    """A section instance back to a plain dict (`UNSET` keys left out; `with_defaults=False` also leaves
    out keys equal to their documented default)."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is UNSET:
            continue
        if not with_defaults and not _is_required(f) and value == f.metadata.get("default", UNSET):
            continue
        out[f.name] = _plain(value, with_defaults)
    return out


def _plain(value, with_defaults: bool):
    if dataclasses.is_dataclass(value):
        return to_dict(value, with_defaults=with_defaults)
    if isinstance(value, list):
        return [_plain(v, with_defaults) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, with_defaults) for k, v in value.items()}
    return value


def type_label(tp, *, nested: bool = False) -> str:
    """A short human description of a field type, e.g. 'list of (gdn | kda | gla)'."""
    base, extras = _unwrap(tp)
    label = next((e.text for e in extras if isinstance(e, Label)), None)
    if label:
        return label
    if base in _PLAIN:
        kw = {k: v for e in extras if isinstance(e, Schema) for k, v in e.keywords.items()}
        return _PLAIN[base] + _range_text(kw)
    if dataclasses.is_dataclass(base):
        return "section"
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is Literal:
        values = " | ".join(map(str, args))
        return f"({values})" if nested else f"one of {values}"
    if _is_union(base):
        rest = [a for a in args if a is not type(None)]
        text = " or ".join(type_label(a) for a in rest)
        return text + (" or null" if len(rest) < len(args) else "")
    if origin is list:
        return "list of " + type_label(args[0], nested=True)
    if origin is dict:
        return "mapping of name -> " + ("anything" if args[1] is Any else type_label(args[1], nested=True))
    return str(base)


def _range_text(kw: dict) -> str:
    parts = []
    for key, sym in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in kw:
            parts.append(f"{sym} {kw[key]}")
    if "multipleOf" in kw:
        parts.append(f"a multiple of {kw['multipleOf']}")
    if "pattern" in kw:
        parts.append(f"matching {kw['pattern']}")
    return (" " + ", ".join(parts)) if parts else ""


def _field_constraints(f: dataclasses.Field) -> str:
    kw = f.metadata.get("schema", {})
    parts = []
    if "minItems" in kw:
        parts.append(f"at least {kw['minItems']} item{'s' if kw['minItems'] != 1 else ''}")
    if "maxItems" in kw:
        parts.append(f"at most {kw['maxItems']} items")
    if kw.get("uniqueItems"):
        parts.append("distinct")
    if "minProperties" in kw:
        parts.append(f"at least {kw['minProperties']} entr{'ies' if kw['minProperties'] != 1 else 'y'}")
    if "propertyNames" in kw:
        parts.append(f"names matching {kw['propertyNames']['pattern']}")
    if "minLength" in kw:
        parts.append("non-empty")
    rng = _range_text(kw)
    if rng:
        parts.append(rng.strip())
    return ", ".join(parts)


def describe(path: str = "") -> str:
    """The settings of one config section as text: one entry per key with its type, allowed values,
    whether it is required or its default, and its help line (for a script's `--help`)."""
    cls = section(path)
    lines = [f"{path or '<top level>'}: {_doc(cls)}"]
    for f in dataclasses.fields(cls):
        child, _ = _child(f.type)
        hint = f" (describe {path + '.' if path else ''}{f.name})" if child is not None else ""
        lines += _field_lines(f, hint, "  ")
    return "\n".join(lines)


def describe_job(cls) -> str:
    """A job's `--params` section as text (a workflow script's `--help`): its keys as `describe` shows them,
    with the keys of each nested section below its own, indented."""
    lines = [f"--params keys ({cls.__name__}): {_doc(cls)}"]
    for f in dataclasses.fields(cls):
        lines += _field_lines(f, "", "  ")
        child, keyed = _child(f.type)
        if child is not None:
            for g in dataclasses.fields(child):
                lines += _field_lines(g, "", "      " + ("<name>." if keyed else ""))
    return "\n".join(lines)


def _field_lines(f: dataclasses.Field, hint: str, indent: str) -> list[str]:
    if _is_required(f):
        status = "required"
    else:
        default = f.metadata.get("default", UNSET)
        status = "optional" if default is UNSET else f"default {json.dumps(default)}"
    extra = _field_constraints(f)
    pad = " " * len(indent)
    return [f"{indent}{f.name}: {type_label(f.type)}{hint}{'; ' + extra if extra else ''}  [{status}]",
            f"{pad}    {f.metadata['help']}"]


def iter_fields(cls=Config, prefix: str = ""):
    """Every (dotted path, field) of the tree below `cls` (each nested dataclass once per path)."""
    for f in dataclasses.fields(cls):
        where = f"{prefix}.{f.name}" if prefix else f.name
        yield where, f
        child, keyed = _child(f.type)
        if child is not None:
            yield from iter_fields(child, where + (".<name>" if keyed else ""))


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m hybridlab.config_spec",
                                description="Print the generated config JSON Schema, or describe a section.")
    p.add_argument("--describe", metavar="SECTION", nargs="?", const="",
                   help="a dotted section path, e.g. experiments.distill or train.bld_sr (empty: top level)")
    args = p.parse_args(argv)
    try:
        sys.stdout.write(json_schema_text() if args.describe is None else describe(args.describe) + "\n")
    except HybridlabError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
