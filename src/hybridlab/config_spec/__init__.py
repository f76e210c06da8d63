"""The config tree of `config.yaml` as typed dataclasses: the one source of truth for its structure.

Every section of the config is a dataclass; every key is a field with a type, its allowed values
and ranges, whether it is required, its default (where it has a natural one) and a one-line help string:

- the type annotation gives the JSON type (`int`, `float`, `str`, `bool`, `Literal[...]` for an enum,
  `list[...]`, `dict[str, ...]` for a mapping of names, `X | None` when null is allowed, a dataclass for a
  nested section); `Annotated[..., Schema(...)]` adds JSON Schema keywords to a type (`PosInt`,
  `Fraction`, `Lang`, ...), and `Def(name)` names a reused type in the schema's `$defs`;
- the field's metadata (`req(...)` / `opt(default, ...)`) carries the help string and keywords that
  constrain this field only (`minItems`, `uniqueItems`, ...);
- a field without a default is required; `opt(UNSET, ...)` is an optional key without a value of its own
  (absent means what its help says, e.g. `seeds` absent: one run with the top-level seed).

Defaults are documentation of what the code does when a key is absent: `validate` never fills them in
and `resolve` returns the config as written, so config hashes do not depend on this module. Use
`section_defaults(path)` or `build(path, data)` to read a section with its defaults applied.

`json_schema()` generates the JSON Schema (2020-12) that `hybridlab.config` validates against; the
committed copy `src/hybridlab/schemas/config.schema.json` is this output (a test checks it), regenerate it
with

    python -m hybridlab.config_spec > src/hybridlab/schemas/config.schema.json

`job_sections` holds one section per pipeline job: the `--params` object its rule passes (built by
`hybridlab.config_spec.job_settings`, shown by `describe_job`).

`describe("experiments.distill")` renders one section's settings as text (for a script's `--help`):

    python -m hybridlab.config_spec --describe train.distill

The package's modules: `fields` (`req`, `opt`, `UNSET` and the named field types), `data_sections`,
`train_sections` and `eval_sections` (a preset's `data` / `models`, `train` and `eval` sections), `tree`
(the top-level sections, `Preset`, `Presets` and `Config`), `schema` (`json_schema()`) and `sections`
(look-up by path, defaults, `build`, `to_dict`, `describe()`, the CLI) and `validate` (one-line messages for
schema errors, `job_settings`); every public name is importable from
`hybridlab.config_spec` itself.
"""

from hybridlab.config_spec.fields import (  # noqa: F401  (re-exported)
    LANG_PATTERN, SCALES, SEEDS_HELP, UNSET, Def, Dtype, Fraction, FreezeScope, Label, Lang, Langs, Mixer, Name,
    NonNegFloat, NonNegInt, Optimizer, Placement, PosFloat, PosInt, Precision, Scale, Schedule, Schema, Seeds, Study,
    UnitFloat, opt, req)
from hybridlab.config_spec.data_sections import (  # noqa: F401  (re-exported)
    BldNlStream, Data, Heldout, LocalSources, Models, Packing, SpacedRetrieval, TeacherShape)
from hybridlab.config_spec.train_sections import (  # noqa: F401  (re-exported)
    BldNlRun, BldNlSize, BldNlTrain, BldSrModel, BldSrTrain, DistillStage, DistillTrain, Run, Train)
from hybridlab.config_spec.eval_sections import (  # noqa: F401  (re-exported)
    Analysis, Eval, Fertility, HeadsPosition, HubPair, LayerImportance, LmEval, Niah, PositionLoss, Recency, RetrievalHeads,
    RetrievalScore, SoftCka)
from hybridlab.config_spec.tree import (  # noqa: F401  (re-exported)
    BldNlArms, BldNlExperiment, BldSrExperiment, Cluster, Config, DistillExperiment, Experiments, Languages, Offline, Preset,
    PresetExperiments, Presets)
from hybridlab.config_spec.schema import _Generator, dataclass_json_schema, json_schema, json_schema_text  # noqa: F401  (re-exported)
from hybridlab.config_spec.sections import (  # noqa: F401  (re-exported)
    _child, build, build_section, describe, describe_job, iter_fields, main, section, section_defaults, to_dict, type_label)
from hybridlab.config_spec.job_sections import (  # noqa: F401  (re-exported)
    DISTILL_JOBS, JOBS, BldNlJob, BldSrJob, ConvertJob, DistillStage1Job, DistillStage2Job, FertilityJob, FigureJob,
    GatherJob, HubCorpusJob, HubLayoutJob, LayerImportanceJob, LmBenchmarksJob, MixtureJob, NiahJob, PerplexityJob, PositionLossJob, RecencyJob, ResultsPageJob,
    RetrievalHeadsJob, RetrievalScoreJob, SoftckaJob, SpacedRetrievalJob, TeacherJob, TokenizerJob)
from hybridlab.config_spec.validate import format_error, job_settings  # noqa: F401  (re-exported)
