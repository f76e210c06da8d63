"""A tiny local in-context recall task for lm-eval, for the rehearsal and the tests (no network).

`write_local_task(directory)` writes a deterministic key-value recall set as JSON lines (columns
context, question, answers: the same as the hub recall sets, so the same prompt and "contains" score
apply) and an lm-eval task config beside it that reads the file with `dataset_path: json` +
`data_files` (an absolute path, which is why the YAML is written rather than shipped). Each row lists
a few "the code of <word> is <number>." facts and asks for one of them as a cloze.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from hybridlab.errors import HybridlabError

LOCAL_TASK = "hybridlab_local_recall"
_WORDS = ("apple", "river", "stone", "cloud", "ember", "maple", "harbor", "lantern", "meadow", "copper",
          "falcon", "violet", "canyon", "saddle", "willow", "glacier")
_FUNCS = "hybridlab.eval.lm_eval_tasks.utils"


def local_recall_rows(n: int = 12, *, facts: int = 4, seed: int = 0) -> list[dict]:
    """`n` recall rows, each with `facts` distinct key-value facts and one asked back (deterministic)."""
    if n < 1 or not 1 <= facts <= len(_WORDS):
        raise HybridlabError(f"local recall task: need n >= 1 and 1 <= facts <= {len(_WORDS)}, got n={n}, "
                             f"facts={facts}")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        keys = rng.sample(_WORDS, facts)
        values = [str(rng.randrange(1000, 10000)) for _ in keys]
        asked = rng.randrange(facts)
        context = " ".join(f"The code of {k} is {v}." for k, v in zip(keys, values))
        rows.append({"id": f"local-{i}", "context": context, "question": f"The code of {keys[asked]} is",
                     "answers": [values[asked]]})
    return rows


def _yaml(data_file: Path) -> str:
    return "\n".join([
        f"# Local in-context recall (written by hybridlab.eval.lm_eval_tasks.local; data: {data_file.name}).",
        f"task: {LOCAL_TASK}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    validation: {json.dumps(str(data_file))}",
        "validation_split: validation",
        "output_type: generate_until",
        f"doc_to_text: !function {_FUNCS}.doc_to_text",
        f"doc_to_target: !function {_FUNCS}.doc_to_target",
        'target_delimiter: " "',
        f"process_results: !function {_FUNCS}.process_results",
        "generation_kwargs:",
        '  until: ["\\n"]',
        "  max_gen_toks: 8",
        "  do_sample: false",
        "metric_list:",
        "  - metric: contains",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        "  version: 1.0",
        "",
    ])


def write_local_task(directory, *, n: int = 12, seed: int = 0) -> Path:
    """Write `<LOCAL_TASK>.jsonl` and `<LOCAL_TASK>.yaml` into `directory`; returns the directory."""
    out = Path(directory).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / f"{LOCAL_TASK}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in local_recall_rows(n, seed=seed)), encoding="utf-8")
    (out / f"{LOCAL_TASK}.yaml").write_text(_yaml(data), encoding="utf-8")
    return out
