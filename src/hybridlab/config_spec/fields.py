"""The building blocks every config section is written with: `req` / `opt` fields carrying help and
JSON Schema keywords, `UNSET`, and the named field types (`PosInt`, `Lang`, `Seeds`, ...) shared by the sections."""

import json
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

LANG_PATTERN = "^[a-z]{3}_[A-Z][a-z]{3}$"



class _Unset:
    """Default of an optional key with no value of its own (absent means what the help says)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Schema:
    """JSON Schema keywords added to a type (`Annotated[int, Schema(minimum=1)]`)."""

    keywords: dict

    def __init__(self, **keywords):
        object.__setattr__(self, "keywords", keywords)

    def __hash__(self) -> int:
        return hash(json.dumps(self.keywords, sort_keys=True))


@dataclass(frozen=True)
class Def:
    """Name under which an annotated type is shared in the schema's `$defs`."""

    name: str


@dataclass(frozen=True)
class Label:
    """Short name of a type in `describe()` output (e.g. 'language code')."""

    text: str


def req(help: str, **keywords) -> Any:
    """A required key: every config (or every preset) must set it."""
    return field(metadata={"help": help, "schema": keywords})


def opt(default: Any, help: str, **keywords) -> Any:
    """An optional key with its default (`UNSET`: no value of its own; absent means what `help` says)."""
    if isinstance(default, (list, dict)):
        value = default
        return field(default_factory=lambda: json.loads(json.dumps(value)),
                     metadata={"help": help, "schema": keywords, "default": value})
    return field(default=default, metadata={"help": help, "schema": keywords, "default": default})


PosInt = Annotated[int, Schema(minimum=1), Def("posint"), Label("integer >= 1")]
NonNegInt = Annotated[int, Schema(minimum=0), Label("integer >= 0")]
Fraction = Annotated[float, Schema(exclusiveMinimum=0, exclusiveMaximum=1), Def("fraction"),
                     Label("number in (0, 1)")]
PosFloat = Annotated[float, Schema(exclusiveMinimum=0), Label("number > 0")]
NonNegFloat = Annotated[float, Schema(minimum=0), Label("number >= 0")]
UnitFloat = Annotated[float, Schema(minimum=0, maximum=1), Label("number in [0, 1]")]
Name = Annotated[str, Schema(minLength=1), Label("non-empty string")]
Lang = Annotated[str, Schema(pattern=LANG_PATTERN), Def("lang"),
                 Label("language code (ISO 639-3 + '_' + ISO 15924 script, e.g. tel_Telu)")]
Langs = Annotated[list[Lang], Schema(minItems=1, uniqueItems=True), Def("langs"),
                  Label("list of language codes (at least 1, distinct)")]
Mixer = Annotated[Literal["gdn", "kda", "gla"], Def("mixer")]
Placement = Annotated[Literal["standard_periodic", "reverse_periodic", "sandwich", "interleaved_sandwich",
                              "endpoint_spread", "searched", "searched_english", "searched_latin",
                              "searched_nonlatin"], Def("placement")]
Seeds = Annotated[list[NonNegInt], Schema(minItems=1, uniqueItems=True), Def("seeds"),
                  Label("list of distinct integers >= 0 (at least 1)")]
Schedule = Literal["cosine", "constant", "linear"]
Optimizer = Literal["adamw", "muon"]
Precision = Literal["auto", "fp32", "bf16", "fast"]
Dtype = Literal["float32", "bfloat16", "float16", "fast"]
FreezeScope = Literal["mixer", "block"]
Scale = Literal["smoke", "tiny", "paper", "rehearsal", "real"]
Study = Literal["multilinguality", "bld"]
SCALES: tuple[str, ...] = typing.get_args(Scale)

SEEDS_HELP = ("replicate seeds: every arm runs once per seed (a `seed` wildcard, one job each); within one "
              "seed all arms share the data order and the initial weights they have in common; absent: one "
              "run with the top-level seed")
