"""The JSON Schema (2020-12) of config.yaml generated from the section dataclasses, and the type
introspection it shares with section look-up and `describe()`."""

import dataclasses
import json
import types
import typing
from typing import Annotated, Any, Literal, Union

from hybridlab.config_spec.fields import UNSET, Def, Schema
from hybridlab.config_spec.tree import Config


def _unwrap(tp) -> tuple[Any, list]:
    """(base type, Annotated extras) of a possibly Annotated type (nested Annotated flattened)."""
    extras: list = []
    while typing.get_origin(tp) is Annotated:
        args = typing.get_args(tp)
        tp, extras = args[0], list(args[1:]) + extras
    return tp, extras


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


_PLAIN = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _with_null(schema: dict) -> dict:
    out = dict(schema)
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    elif "type" in out:
        t = out["type"]
        out["type"] = [*(t if isinstance(t, list) else [t]), "null"]
    else:
        out = {"anyOf": [schema, {"type": "null"}]}
    return out


class _Generator:
    def __init__(self) -> None:
        self.defs: dict[str, dict] = {}

    def type_schema(self, tp, *, inline: bool = False) -> dict:
        base, extras = _unwrap(tp)
        name = next((e.name for e in extras if isinstance(e, Def)), None)
        if name and not inline:
            if name not in self.defs:
                self.defs[name] = {}  # reserve (and keep first-use order)
                self.defs[name] = self.type_schema(tp, inline=True)
            return {"$ref": f"#/$defs/{name}"}
        schema = self._base_schema(base)
        for e in extras:
            if isinstance(e, Schema):
                schema.update(e.keywords)
        return schema

    def _base_schema(self, tp) -> dict:
        if tp in _PLAIN:
            return {"type": _PLAIN[tp]}
        if tp is Any:
            return {}
        if dataclasses.is_dataclass(tp):
            name = tp.__name__
            if name not in self.defs:
                self.defs[name] = {}
                self.defs[name] = self.dataclass_schema(tp)
            return {"$ref": f"#/$defs/{name}"}
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is Literal:
            return {"enum": list(args)}
        if _is_union(tp):
            rest = [a for a in args if a is not type(None)]
            if len(rest) < len(args):  # X | None: inline X (a $ref cannot take the null)
                inner = self.type_schema(rest[0] if len(rest) == 1 else Union[tuple(rest)], inline=True)
                return _with_null(inner)
            parts = [self.type_schema(a, inline=True) for a in rest]
            if all(set(p) == {"type"} for p in parts):
                return {"type": [p["type"] for p in parts]}
            return {"anyOf": parts}
        if origin is list:
            return {"type": "array", "items": self.type_schema(args[0])}
        if origin is dict:
            value = self.type_schema(args[1])
            return {"type": "object", **({"additionalProperties": value} if value else {})}
        raise TypeError(f"config_spec: no JSON Schema for type {tp!r}")

    def field_schema(self, f: dataclasses.Field) -> dict:
        keywords = f.metadata.get("schema", {})
        schema = self.type_schema(f.type, inline=bool(keywords))  # a field's own keywords need it inline
        out = {"description": f.metadata["help"], **schema, **keywords}
        default = f.metadata.get("default", UNSET)
        if default is not UNSET:
            out["default"] = default
        return out

    def dataclass_schema(self, cls) -> dict:
        fields = dataclasses.fields(cls)
        out: dict = {"type": "object", "description": _doc(cls), "additionalProperties": False}
        required = [f.name for f in fields if _is_required(f)]
        if required:
            out["required"] = required
        out.update(getattr(cls, "__schema_extra__", {}))
        out["properties"] = {f.name: self.field_schema(f) for f in fields}
        return out


def _doc(cls) -> str:
    return " ".join((cls.__doc__ or "").split())


def _is_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def json_schema() -> dict:
    """The JSON Schema (2020-12) of config.yaml, generated from the dataclasses."""
    gen = _Generator()
    root = gen.dataclass_schema(Config)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "hybridlab config.yaml",
            "$comment": "GENERATED from src/hybridlab/config_spec/; do not edit. Regenerate with "
                        "`python -m hybridlab.config_spec > src/hybridlab/schemas/config.schema.json`",
            **{k: v for k, v in root.items() if k != "description"}, "$defs": gen.defs}


def dataclass_json_schema(cls) -> dict:
    """The JSON Schema of one section dataclass on its own (a job's `--params`, `job_sections`)."""
    gen = _Generator()
    root = gen.dataclass_schema(cls)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **root, "$defs": gen.defs}


def json_schema_text() -> str:
    """`json_schema()` as the committed file holds it (2-space indent, trailing newline)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
