"""dvc.yaml is complete: every stage depends on every file its command parses, runs or imports.

A stage's command is `snakemake <phase>`: it parses the Snakefile and every rules file (and what they
import at parse time), and runs the workflow scripts of its phase's rules, which import library
modules, which import others. The closure is computed from the sources (imports anywhere in a file,
also inside functions), so a new import that reaches a path a stage's deps lack fails here.
"""

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
SCRIPTS = ROOT / "workflow_scripts"
PHASES = ["data", "models", "train", "eval", "figures"]
# Files a module reads at run time besides its imports.
RESOURCES = {"hybridlab.eval.lm_eval": ["src/hybridlab/eval/lm_eval_tasks"]}
SMK_IMPORT = re.compile(r"^\s*(?:from\s+(hybridlab[\w.]*)\s+import\s+([\w, ()]+)|import\s+(hybridlab[\w.]*))", re.M)


def _module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _imports_of_python(path: Path) -> tuple[set[str], set[str]]:
    """(hybridlab modules, local workflow_scripts modules) imported anywhere in a Python file."""
    mods, local = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                (mods if alias.name.startswith("hybridlab") else local).add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("hybridlab"):
                mods.add(node.module)
                mods.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import submodule`
            else:
                local.add(node.module)
    return mods, {m for m in local if (SCRIPTS / f"{m}.py").is_file()}


def _imports_of_smk(text: str) -> set[str]:
    mods = set()
    for frm, names, plain in SMK_IMPORT.findall(text):
        if plain:
            mods.add(plain)
        else:
            mods.add(frm)
            mods.update(f"{frm}.{n.strip()}" for n in names.strip("()").split(",") if n.strip())
    return mods


def reached_files(phase: str) -> set[str]:
    """Repository-relative files `snakemake <phase>` parses, runs or imports."""
    smk = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]
    files = {p.relative_to(ROOT).as_posix() for p in smk}
    modules: set[str] = set()
    for p in smk:
        modules |= _imports_of_smk(p.read_text())
    phase_rules = (ROOT / "rules" / f"{phase}.smk").read_text()
    scripts = {SCRIPTS / name for name in re.findall(r"([A-Za-z_]\w*\.py)", phase_rules) if (SCRIPTS / name).is_file()}
    todo, seen_scripts = list(scripts), set()
    while todo:
        script = todo.pop()
        if script in seen_scripts:
            continue
        seen_scripts.add(script)
        mods, local = _imports_of_python(script)
        modules |= mods
        todo += [SCRIPTS / f"{m}.py" for m in local]
    files |= {p.relative_to(ROOT).as_posix() for p in seen_scripts}
    todo, seen = [m for name in modules for m in _with_parents(name)], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is None:
            continue  # an attribute imported with `from pkg import name`, not a module
        files.add(path.relative_to(ROOT).as_posix())
        files.update(RESOURCES.get(name, []))
        mods, _ = _imports_of_python(path)
        todo += [m for mod in mods for m in _with_parents(mod)]
    return files


def stage_deps(phase: str) -> list[str]:
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][phase]
    return [d.replace("${scale}", "SCALE") for d in stage["deps"]]


def _covered(path: str, deps: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


@pytest.mark.parametrize("phase", PHASES)
def test_every_stage_depends_on_what_its_command_reaches(phase):
    deps = stage_deps(phase)
    missing = sorted(f for f in reached_files(phase) if not _covered(f, deps))
    assert not missing, f"dvc.yaml stage {phase!r} lacks deps for {missing[:12]}"


def test_the_closure_sees_parse_time_script_and_nested_imports():
    """The check can fail: each kind of reach is found (so a missing dep for it would be reported)."""
    models = reached_files("models")
    assert "rules/figures.smk" in models  # every rules file is parsed by every phase
    assert "workflow_scripts/pretrain_teacher.py" in models and "workflow_scripts/_common.py" in models
    assert "src/hybridlab/train/loop.py" in models  # the teacher trains in the models phase
    assert "src/hybridlab/config_spec/tree.py" in models  # parse-time config validation (the schema's source)
    assert not _covered("src/hybridlab/train/loop.py", ["src/hybridlab/models"])
