"""No upward imports in the library: data -> models -> config -> train -> eval -> plots -> pipeline
(docs/methods.md, "Code layering"), and no import cycles between its modules.

A module under src/hybridlab/<layer>/ may import hybridlab modules of its own layer or of layers to its left,
never of a layer to its right. Every import counts, at module level or inside a function (a lazy import is
still a dependency). `hybridlab.config` (the config loader: it checks meaning against the language registry and
the placement names) is the layer between models and train. Outside the layers: `hybridlab.errors`,
`hybridlab.atomic` (atomic writes), `hybridlab.device` (the device policy), `hybridlab.heap` (malloc settings),
`hybridlab.config_spec` (the typed settings and `job_settings`; it imports nothing of the library but errors) and
the package itself (`__version__`) sit below all of them (anything may import them), and the application modules
(`cli`, `provenance`, `cache`, `rehearsal`) sit above the pipeline wing, like the workflow scripts: they may
import anything and no layered module may import them.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "hybridlab"
LAYERS = ("data", "models", "config", "train", "eval", "plots", "pipeline")
BASE = {"errors": -1, "atomic": -1, "device": -1, "heap": -1, "config_spec": -1}
APPLICATION = len(LAYERS)


def layer_of(module: str) -> int | None:
    """Layer index of a dotted hybridlab module name; None for anything outside hybridlab."""
    parts = module.split(".")
    if parts[0] != "hybridlab":
        return None
    if len(parts) == 1:
        return -1  # the package itself: only __version__
    head = parts[1]
    if head in LAYERS:
        return LAYERS.index(head)
    return BASE.get(head, APPLICATION)


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, importer: str, is_package: bool):
    """(line, module) for every import in `tree`, relative imports resolved, `from pkg import name` as pkg.name."""
    package = importer if is_package else importer.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "hybridlab":  # `from hybridlab import x`: x is the module that counts
                for alias in node.names:
                    yield node.lineno, f"hybridlab.{alias.name}"
            else:
                yield node.lineno, module


def upward_imports(source: str, path: Path) -> list[str]:
    importer = module_name(path)
    own = layer_of(importer)
    found = []
    for line, module in imported_modules(ast.parse(source, str(path)), importer, path.name == "__init__.py"):
        layer = layer_of(module)
        if layer is not None and own is not None and layer > own:
            found.append(f"{path.relative_to(ROOT)}:{line}: imports {module} "
                         f"({_name(layer)} layer, above {_name(own)})")
    return found


def _name(layer: int) -> str:
    return LAYERS[layer] if 0 <= layer < len(LAYERS) else "application" if layer == APPLICATION else "base"


def test_no_library_module_imports_a_higher_layer():
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 50  # the walk sees the library
    found = [msg for path in modules for msg in upward_imports(path.read_text(), path)]
    assert not found, "upward imports (move the function to the lowest layer that needs it):\n" + "\n".join(found)


def test_the_check_sees_every_kind_of_upward_import():
    """The check can fail: top-level, lazy, relative, `from hybridlab import` and application imports."""
    source = "\n".join([
        "import hybridlab.models.io",
        "from hybridlab.errors import HybridlabError",
        "def f():",
        "    from hybridlab.eval.capture import capture_hidden_states",
        "    from ..train import loop",
        "    from hybridlab import plots",
        "    import hybridlab.provenance",
        "    from . import packing",
        "    import torch",
    ])
    found = upward_imports(source, SRC / "data" / "example.py")
    assert [m.split(": imports ")[1].split(" (")[0] for m in found] == [
        "hybridlab.models.io", "hybridlab.eval.capture", "hybridlab.train", "hybridlab.plots", "hybridlab.provenance"]
    assert found[1] == ("src/hybridlab/data/example.py:4: imports hybridlab.eval.capture (eval layer, above data)")
    assert upward_imports(source, SRC / "plots" / "example.py") == [
        "src/hybridlab/plots/example.py:7: imports hybridlab.provenance (application layer, above plots)"]
    assert upward_imports("from hybridlab.models import placements\n", ROOT / "src/hybridlab/config.py") == []
    assert upward_imports("from hybridlab.config import resolve\n", SRC / "data" / "example.py") == [
        "src/hybridlab/data/example.py:1: imports hybridlab.config (config layer, above data)"]
    assert upward_imports("from hybridlab.config_spec import job_settings\n", SRC / "data" / "example.py") == []


# --- import cycles ------------------------------------------------------------------------------------------

def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the library modules it imports (lazy imports included), from {module: (source, is_package)}.

    `from pkg import name` counts as an import of `pkg.name` when that is a module, else of `pkg`.
    """
    graph = {}
    for module, (source, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        targets = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
                targets += [f"{base}.{alias.name}" for alias in node.names]
        edges = set()
        for target in targets:
            while target and target not in sources:  # `from pkg import function` -> pkg
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other, directly or through others (strongly connected
    components of more than one module), each as a sorted list."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def library_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in sorted(SRC.rglob("*.py"))}


def test_no_import_cycles():
    cycles = import_cycles(import_graph(library_sources()))
    assert not cycles, ("modules that import each other (move what both need into a module below them):\n"
                        + "\n".join(" <-> ".join(c) for c in cycles))


def test_the_check_finds_a_cycle_through_a_lazy_import():
    """A deliberate cycle a -> b -> c -> a, its last edge inside a function, next to an acyclic module."""
    sources = {
        "hybridlab.train": ("", True),
        "hybridlab.train.a": ("from hybridlab.train.b import run\n", False),
        "hybridlab.train.b": ("from hybridlab.train import c\nimport torch\n", False),
        "hybridlab.train.c": ("def f():\n    from .a import g\n", False),
        "hybridlab.train.d": ("from hybridlab.train import a\nfrom hybridlab.errors import HybridlabError\n", False),
    }
    graph = import_graph(sources)
    assert graph["hybridlab.train.b"] == {"hybridlab.train.c"} and graph["hybridlab.train.c"] == {"hybridlab.train.a"}
    assert import_cycles(graph) == [["hybridlab.train.a", "hybridlab.train.b", "hybridlab.train.c"]]
    sources["hybridlab.train.c"] = ("def f():\n    import torch\n", False)
    assert import_cycles(import_graph(sources)) == []


MAX_MODULE_LINES = 600


def test_no_library_module_over_the_line_limit():
    """A module a newcomer reads in one sitting: none of src/hybridlab over MAX_MODULE_LINES lines."""
    sizes = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    assert len(sizes) > 50
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}
