"""The project speaks of itself: a short README, no work log, no bare issue numbers.

(a) README.md is at most 200 lines and 16 KB (16,000 bytes); everything longer lives under docs/.
(b) No numbered work rounds and no bare issue references in README.md, docs/, src/, rules/,
    workflow_scripts/ and benchmarks/ (text files; binaries, caches and *.egg-info skipped):

    - a numbered work round is "session" or "round" followed by a number ("Session 9", "sessions 4-6",
      "session-7 machine", "round 3");
    - an issue reference is "issue" followed by a number, with or without "#" ("issue 12", "issue-15",
      "issue #16"), or a standalone "#<digits>": at the start of a line or after a space, "(", "[", ",",
      ";" or ":" ("#14", "(#14)"), and not followed by a letter or digit (so a colour "#0173b2", an HTML
      entity "&#10;" or a regex class "[-+#0']" are not references);
    - an issue reference is allowed when the word right before it names another project
      (EXTERNAL_PROJECTS), optionally followed by "issue", "PR" or "pull request": "transformers #12345",
      "DVC issue #9021", "fla PR #321". A repository-qualified ref ("fla-org/flash-linear-attention#321") is
      not standalone and passes as well.

    Lines this test rejects, for example:
        "On session 7's slower AVX2-only 2-core EPYC ..."          (numbered work round)
        "Targets (issue 12): distillation >= 40 % MFU"               (bare issue reference)
        "Tests grouped by layer (#15)"                                (bare issue reference)
(c) The README keeps exactly one pair of findings markers, begin before end
    (workflow_scripts/readme_findings.py splices the generated findings table between them).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SCANNED = ("README.md", "docs", "src", "rules", "workflow_scripts", "benchmarks")
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".snakemake"}
BINARY = {".png", ".pdf", ".jpg", ".jpeg", ".gif", ".svg", ".parquet", ".npy", ".xz", ".gz", ".zip", ".pyc", ".so"}
MAX_LINES, MAX_BYTES = 200, 16_000

# Markers of hybridlab.plots.findings (BEGIN, END); repeated here so this test needs no library import.
BEGIN, END = "<!-- findings table: generated, begin -->", "<!-- findings table: generated, end -->"

EXTERNAL_PROJECTS = (
    "transformers", "fla", "flash-linear-attention", "snakemake", "snakemake-executor-plugin-slurm", "dvc",
    "pytorch", "torch", "triton", "lm-eval", "lm-evaluation-harness", "polars", "pytest", "pytest-xdist",
    "datasets", "huggingface_hub", "accelerate", "numpy", "glibc", "onednn", "mkl", "llama.cpp", "gguf",
)
WORK_ROUND = re.compile(r"\b(?:sessions?|rounds?)[ -]\d+", re.IGNORECASE)
ISSUE_REF = re.compile(r"\bissues?[ -]?#?\d+(?!\w)|(?:^|(?<=[\s(\[,;:]))#\d+(?!\w)", re.IGNORECASE | re.MULTILINE)
PROJECT_BEFORE = re.compile(
    r"\b(?:" + "|".join(re.escape(p) for p in EXTERNAL_PROJECTS) + r")(?:'s)?\s+(?:(?:issue|pr|pull request)\s+)?$",
    re.IGNORECASE,
)


def hygiene_hits(line: str) -> list[str]:
    """The numbered work rounds and bare issue references in one line of text (empty: the line is clean)."""
    hits = [m.group(0) for m in WORK_ROUND.finditer(line)]
    for m in ISSUE_REF.finditer(line):
        if not PROJECT_BEFORE.search(line[: m.start()]):
            hits.append(m.group(0).strip())
    return hits


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
            continue
        for f in sorted(path.rglob("*")):
            parts = set(f.relative_to(ROOT).parts)
            if (not f.is_file() or f.suffix.lower() in BINARY or parts & SKIP_DIRS
                    or any(p.endswith(".egg-info") for p in parts)):
                continue
            files.append(f)
    return files


@pytest.mark.parametrize("line", [
    "On session 7's slower AVX2-only 2-core EPYC (34.5 GFLOP/s fp32 matmul per core)",
    "The table above is from the Zen 5 development machine of sessions 4-6.",
    "### Session 12: the same Xeon type",
    "Clean clone on the session-7 machine",
    "for round_idx in range(reps + 1):  # round 0 is the warm-up",
    "Targets (issue 12): distillation >= 40 % MFU at 4B shapes",
    "## Before/after check of the issue-15 refactor",
    "Why a target is met or missed on this CPU (issue #16):",
    "Tests grouped by layer (#15): tests/{data,models}",
    "#14 asks for three seeds",
    "Goal (issue #16 item 5, #15 item 7): the whole run",
])
def test_rule_rejects(line):
    assert hygiene_hits(line), f"the hygiene rule should reject: {line!r}"


@pytest.mark.parametrize("line", [
    "`dvc repro --dry` stops at the first stage (DVC issue #9021);",
    "a workaround for transformers #12345 and fla #321",
    "see fla-org/flash-linear-attention#321",
    'ROLE_COLORS = {"hybrid": "#0173b2", "dense": "#de8f05"}',
    "a character entity (`&amp;`, `&#10;`)",
    r"""r"%(?:\([^)\s]+\))?[-+#0']*(?:\d+\$)?" """,
    "the tests share one smoke repository per pytest run; every round is timed",
    "start_new_session=True",
])
def test_rule_allows(line):
    assert not hygiene_hits(line), f"the hygiene rule should allow: {line!r}"


def test_readme_is_short():
    text = README.read_text(encoding="utf-8")
    n_lines, n_bytes = len(text.splitlines()), len(text.encode("utf-8"))
    assert n_lines <= MAX_LINES and n_bytes <= MAX_BYTES, (
        f"README.md has {n_lines} lines and {n_bytes} bytes (at most {MAX_LINES} lines and {MAX_BYTES} bytes); "
        "move reference material to a page under docs/")


def test_no_work_rounds_or_issue_numbers():
    hits = []
    for f in scanned_files():
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for hit in hygiene_hits(line):
                hits.append(f"{f.relative_to(ROOT)}:{i}: {hit!r} in {line.strip()[:100]!r}")
    assert not hits, ("numbered work rounds or bare issue references (describe the project, not its history; "
                      "name another project's issue as '<project> #N'):\n" + "\n".join(hits))


def test_readme_keeps_one_pair_of_findings_markers():
    text = README.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "README.md needs exactly one findings begin and end marker"
    assert text.index(BEGIN) < text.index(END), "README.md's findings begin marker must come before its end marker"


def test_markers_match_the_splicer():
    findings = (ROOT / "src" / "hybridlab" / "plots" / "findings.py").read_text(encoding="utf-8")
    assert f'"{BEGIN}"' in findings and f'"{END}"' in findings, (
        "the findings markers changed in hybridlab.plots.findings; update BEGIN and END here")
