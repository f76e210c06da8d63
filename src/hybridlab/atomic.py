"""Atomic writes: the one place where an output is written under a temporary name and renamed into place.

A killed job never leaves a half-written output under the real name: everything is written to a hidden,
recognisable sibling ``.<name>.tmp-<pid>`` (same directory, so the rename is atomic; a plain name, not
mkstemp, so the result gets the usual umask permissions) and renamed over `path` only when the write
succeeded. After an error the temporary file or directory is removed and a previous output is untouched;
temporaries that killed earlier writes of the same `path` left (their process is gone) are removed when
the next write starts.

- `atomic_file(path)`: ``with atomic_file(path) as tmp: <write the file tmp>`` (any writer that takes a
  path: polars' ``write_parquet``, ``savefig(format=...)``, ``torch.save``, ...; the temporary name has
  no useful suffix, so name the format where the writer guesses it from the suffix).
- `atomic_dir(path)`: ``with atomic_dir(path) as tmp: <fill the empty directory tmp>``; on success it
  replaces `path` whole (a previous directory is moved aside, the new one renamed in, the old removed).
- `write_text` / `write_bytes`: one-call conveniences over `atomic_file`.
- `temp_path(path)` and `publish(tmp, path)`: the two halves, for a writer that cannot sit inside one
  ``with`` block (DCP checkpoints, whose temporary directory every rank writes under one agreed name).

Standard library only: it sits below every layer, so any module may use it. `tests/workflow/test_atomic.py`
fails if any other module renames files itself.
"""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TMP_MARK = ".tmp-"
OLD_MARK = ".old-"


def temp_path(path: str | Path) -> Path:
    """The temporary sibling of `path` this process writes: ``.<name>.tmp-<pid>``."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(path: str | Path) -> None:
    """Remove the temporaries of `path` left by writes that were killed (their process is gone)."""
    path = Path(path)
    if not path.parent.is_dir():
        return
    pattern = re.compile(re.escape(f".{path.name}") + f"(?:{re.escape(TMP_MARK)}|{re.escape(OLD_MARK)})" + r"(\d+)")
    for p in path.parent.iterdir():
        m = pattern.fullmatch(p.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            _remove(p)


def publish(tmp: str | Path, path: str | Path) -> Path:
    """Rename the finished `tmp` (a file or a directory) to `path`, replacing what is there; returns `path`.

    A file replaces atomically. A directory replaces a previous directory by moving it aside to
    ``.<name>.old-<pid>``, renaming `tmp` in and removing the old one, so `path` is missing only between
    two renames.
    """
    tmp, path = Path(tmp), Path(path)
    if tmp.is_dir() and path.is_dir() and not path.is_symlink():
        old = path.with_name(f".{path.name}{OLD_MARK}{os.getpid()}")
        _remove(old)
        os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        if tmp.is_dir() and path.exists():
            _remove(path)  # a file (or link) where the directory goes
        os.replace(tmp, path)
    return path


@contextmanager
def _atomic(path: str | Path, *, directory: bool) -> Iterator[Path]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    tmp = temp_path(path)
    _remove(tmp)
    if directory:
        tmp.mkdir()
    try:
        yield tmp
        publish(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def atomic_file(path: str | Path):
    """Context manager: yield the temporary path to write; on success it replaces `path` (parents
    created), on error it is removed and `path` is untouched."""
    return _atomic(path, directory=False)


def atomic_dir(path: str | Path):
    """Context manager: yield an empty temporary directory to fill; on success it replaces `path` whole
    (parents created), on error it is removed and `path` is untouched."""
    return _atomic(path, directory=True)


def write_text(path: str | Path, text: str, encoding: str | None = None) -> Path:
    """Write `text` to `path` atomically; returns `path`."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically; returns `path`."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)
