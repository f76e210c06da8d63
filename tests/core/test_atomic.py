"""`hybridlab.atomic`: every output is written under a hidden temporary sibling and renamed into place.

Files and directories: success replaces the output, an error leaves the previous output untouched and no
temporary behind, and temporaries of killed writes are cleaned up by the next write. The last test parses
src/hybridlab and workflow_scripts and fails if any module other than `hybridlab.atomic` renames files itself.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridlab import atomic
from hybridlab.atomic import atomic_dir, atomic_file, publish, temp_path, write_bytes, write_text

ROOT = Path(__file__).resolve().parents[2]


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_temp_names_are_hidden_siblings_with_the_pid(tmp_path):
    assert temp_path(tmp_path / "a.parquet") == tmp_path / f".a.parquet.tmp-{os.getpid()}"


def test_a_file_is_renamed_into_place_on_success(tmp_path):
    out = tmp_path / "sub" / "deeper" / "t.txt"  # parents are created
    with atomic_file(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(".t.txt.tmp-") and not out.exists()
        tmp.write_text("one")
    assert out.read_text() == "one" and _names(out.parent) == ["t.txt"]
    assert write_text(out, "two") == out and out.read_text() == "two"
    write_bytes(out, b"\x00\x01")
    assert out.read_bytes() == b"\x00\x01" and _names(out.parent) == ["t.txt"]
    write_text(out, "три", encoding="utf-8")
    assert out.read_text(encoding="utf-8") == "три"


def test_a_failed_file_write_keeps_the_previous_output_and_leaves_no_temp(tmp_path):
    out = tmp_path / "t.txt"
    write_text(out, "previous")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_file(out) as tmp:
            tmp.write_text("half-writ")
            raise RuntimeError("killed mid-write")
    assert out.read_text() == "previous" and _names(tmp_path) == ["t.txt"]
    with pytest.raises(KeyboardInterrupt):  # an interrupt cleans up too
        with atomic_file(tmp_path / "new.txt") as tmp:
            tmp.write_text("x")
            raise KeyboardInterrupt
    assert _names(tmp_path) == ["t.txt"]


def test_a_polars_table_written_to_the_temporary_path(tmp_path):
    pl = pytest.importorskip("polars")
    out = tmp_path / "t.parquet"
    for values in ([1, 2], [3]):
        with atomic_file(out) as tmp:
            pl.DataFrame({"a": values}).write_parquet(tmp)
    assert pl.read_parquet(out)["a"].to_list() == [3] and _names(tmp_path) == ["t.parquet"]


def test_a_directory_replaces_the_previous_one_whole_only_on_success(tmp_path):
    out = tmp_path / "model"
    with atomic_dir(out) as tmp:
        assert tmp.is_dir() and not any(tmp.iterdir()) and tmp.name.startswith(".model.tmp-")
        (tmp / "a.txt").write_text("1")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("2")
    assert _names(out) == ["a.txt", "sub"] and _names(tmp_path) == ["model"]
    with atomic_dir(out) as tmp:
        (tmp / "c.txt").write_text("3")
    assert _names(out) == ["c.txt"] and _names(tmp_path) == ["model"]  # replaced whole, nothing aside
    with pytest.raises(ValueError):
        with atomic_dir(out) as tmp:
            (tmp / "d.txt").write_text("4")
            raise ValueError("failed")
    assert _names(out) == ["c.txt"] and _names(tmp_path) == ["model"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_of_killed_writes_are_removed_by_the_next_write(tmp_path):
    dead = _dead_pid()
    (tmp_path / f".model.tmp-{dead}").mkdir()
    (tmp_path / f".model.tmp-{dead}" / "half.bin").write_bytes(b"x")
    (tmp_path / f".model.old-{dead}").mkdir()
    (tmp_path / f".t.txt.tmp-{dead}").write_text("half")
    live = tmp_path / f".t.txt.tmp-{os.getppid()}"  # a live process's write is left alone
    live.write_text("in progress")
    (tmp_path / ".other.tmp-1").write_text("another output's")
    with atomic_dir(tmp_path / "model") as tmp:
        (tmp / "w.bin").write_bytes(b"w")
    write_text(tmp_path / "t.txt", "done")
    assert _names(tmp_path) == sorted([".other.tmp-1", live.name, "model", "t.txt"])


def test_publish_moves_a_prepared_file_or_directory_into_place(tmp_path):
    """The two-step form (DCP checkpoints: every rank writes one agreed temporary directory)."""
    final = tmp_path / "step_000000003"
    for n in (1, 2):
        tmp = tmp_path / ".tmp_step_000000003"
        tmp.mkdir()
        (tmp / f"shard{n}").write_text(str(n))
        assert publish(tmp, final) == final
        assert _names(final) == [f"shard{n}"] and _names(tmp_path) == ["step_000000003"]
    f = tmp_path / ".x.tmp"
    f.write_text("x")
    publish(f, tmp_path / "x")
    assert (tmp_path / "x").read_text() == "x" and not f.exists()


def test_a_failed_swap_puts_the_previous_directory_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    real = os.replace
    calls = []

    def flaky(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:  # the new directory's rename fails
            raise OSError("disk gone")
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", flaky)
    with pytest.raises(OSError, match="disk gone"):
        with atomic_dir(out) as tmp:
            (tmp / "new.txt").write_text("new")
    assert _names(out) == ["old.txt"] and _names(tmp_path) == ["out"]


# ---- the rule: no module renames files itself -------------------------------------------------------------------

RENAMES = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move")}


def renames_in(source: str, where: str) -> list[str]:
    """`file:line: call` for every call that moves a file: os.replace / os.rename / shutil.move, and the
    pathlib `.rename(target)` / `.replace(target)` (one positional argument; polars' `.rename({...})`
    takes a mapping and str.replace two arguments, so neither counts)."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        attr, owner = node.func.attr, node.func.value
        if isinstance(owner, ast.Name) and (owner.id, attr) in RENAMES:
            found.append(f"{where}:{node.lineno}: {owner.id}.{attr}(...)")
        elif attr in ("rename", "replace") and len(node.args) == 1 and not node.keywords \
                and not isinstance(node.args[0], (ast.Dict, ast.DictComp)) \
                and not (isinstance(owner, ast.Name) and owner.id in ("dataclasses", "str")):
            found.append(f"{where}:{node.lineno}: .{attr}(...)")
    return found


def test_the_rename_check_sees_every_kind_of_move():
    source = "\n".join([
        "import os, shutil",
        "os.replace(tmp, out)",
        "tmp.rename(out)",
        "Path(tmp).replace(out)",
        "shutil.move(a, b)",
        "df.rename({'a': 'b'})",
        "s.replace('a', 'b')",
        "col.str.replace(r'x', '')",
        "dataclasses.replace(state, a=1)",
        "df.rename(mapping)",  # a variable mapping is flagged too: rename it inline or through a dict literal
    ])
    assert [m.split(": ", 1)[1] for m in renames_in(source, "x.py")] == [
        "os.replace(...)", ".rename(...)", ".replace(...)", "shutil.move(...)", ".rename(...)"]


def test_no_module_but_the_helper_renames_files():
    files = sorted((ROOT / "src" / "hybridlab").rglob("*.py")) + sorted((ROOT / "workflow_scripts").rglob("*.py"))
    assert len(files) > 50
    helper = ROOT / "src" / "hybridlab" / "atomic.py"
    found = [m for f in files if f != helper for m in renames_in(f.read_text(), str(f.relative_to(ROOT)))]
    assert not found, ("write through hybridlab.atomic (atomic_file / atomic_dir / write_text / publish) instead of "
                       "renaming files yourself:\n" + "\n".join(found))
    assert renames_in(helper.read_text(), "atomic.py")  # the check does look at real code


def test_write_parquet_creates_parents_and_leaves_no_temporary(tmp_path):
    import polars as pl

    df = pl.DataFrame({"a": [1, 2], "b": ["x", None]})
    out = tmp_path / "deep" / "dir" / "t.parquet"
    atomic.write_parquet(out, df)
    assert pl.read_parquet(out).equals(df)
    assert [p.name for p in out.parent.iterdir()] == ["t.parquet"]
    # polars' default writer: the bytes are those of a plain write_parquet
    df.write_parquet(tmp_path / "plain.parquet")
    assert out.read_bytes() == (tmp_path / "plain.parquet").read_bytes()


def test_write_parquet_replaces_atomically(tmp_path):
    import polars as pl

    out = tmp_path / "sub" / "t.parquet"
    atomic.write_parquet(out, pl.DataFrame({"a": [1, 2]}), statistics=False)
    atomic.write_parquet(out, pl.DataFrame({"a": [3]}), statistics=False)
    assert pl.read_parquet(out)["a"].to_list() == [3]
    assert [p.name for p in out.parent.iterdir()] == ["t.parquet"]
