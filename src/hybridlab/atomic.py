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
- `write_text` / `write_bytes` / `write_parquet`: one-call conveniences over `atomic_file`.
- `temp_path(path)` and `publish(tmp, path)`: the two halves, for a writer that cannot sit inside one
  ``with`` block (DCP checkpoints, whose temporary directory every rank writes under one agreed name).

A full disk (ENOSPC, or a quota) while writing becomes one `HybridlabError` line naming the output
(`no_space`); the temporary is removed as after any error.

Damaged outputs: `digests` / `verify_digests` and the manifest helpers (`write_manifest`,
`verify_manifest`) record the sha256 of each file a writer made and check it on read, so a truncated or
hand-edited file (same size or mtime or not) is found before it is used; `rebuild_hint(path)` says how to
rebuild a pipeline output.

Standard library (and `hybridlab.errors`) only: it sits below every layer, so any module may use it.
`tests/core/test_atomic.py` fails if any other module renames files itself.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from hybridlab.errors import HybridlabError

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
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, Exception) and disk_full(exc):
            raise no_space(path) from exc
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


def write_parquet(path: str | Path, frame, *, statistics: bool = True) -> Path:
    """Write the polars table `frame` to `path` atomically (polars' writer; `statistics`: its column
    statistics); returns `path`."""
    with atomic_file(path) as tmp:
        frame.write_parquet(tmp, statistics=statistics)
    return Path(path)


# --- full disk ---------------------------------------------------------------------------------------------

_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("no space left on device", "disk quota exceeded", "os error 28", "os error 122")


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it wraps: cause, context, DCP's per-rank failures) is a full disk."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, tuple):  # DCP keeps (exception, traceback summary) per failed rank
            todo.extend(x for x in e if isinstance(x, BaseException))
            continue
        if getattr(e, "errno", None) in _FULL or any(t in str(e).lower() for t in _FULL_TEXT):
            return True
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo.extend(failures.values())
        todo.extend([e.__cause__, e.__context__])
    return False


def no_space(path: str | Path) -> HybridlabError:
    """The one-line error for a write of `path` that found the disk full."""
    return HybridlabError(f"no space left on device writing {path}; nothing was written there: free space and "
                          "rerun the same command")


# --- checksums of written files ---------------------------------------------------------------------------

MANIFEST = "checksums.sha256"


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _files(directory: Path) -> list[str]:
    """Relative paths of the regular files under `directory`, sorted, without temporaries and the manifest."""
    out = []
    for p in directory.rglob("*"):
        rel = p.relative_to(directory).as_posix()
        if p.is_file() and rel != MANIFEST and TMP_MARK not in p.name and OLD_MARK not in p.name:
            out.append(rel)
    return sorted(out)


def digests(directory: str | Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """{relative path: sha256} of `names` in `directory` (default: every file under it)."""
    directory = Path(directory)
    return {n: sha256_file(directory / n) for n in (sorted(names) if names is not None else _files(directory))}


def verify_digests(directory: str | Path, expected: dict[str, str], fix: str, *, what: str = "file",
                   share: tuple[int, int] = (0, 1)) -> None:
    """Raise a one-line HybridlabError for the first file of `expected` that is missing or whose sha256
    differs; `fix` ends the line. `share=(i, n)` checks every n-th file from the i-th (ranks split the work)."""
    directory = Path(directory)
    i, n = share
    for name in sorted(expected)[i::n]:
        f = directory / name
        if not f.is_file():
            raise HybridlabError(f"{what} {f} is missing (listed in the checksums of {directory}); {fix}")
        if sha256_file(f) != expected[name]:
            raise HybridlabError(f"{what} {f} does not match its recorded sha256 (damaged or edited after it "
                                 f"was written); {fix}")


def write_manifest(directory: str | Path) -> dict[str, str]:
    """Write `MANIFEST` (``<sha256>  <path>`` lines, `sha256sum -c` format) for every file under `directory`,
    atomically; call it last, so a manifest means a complete directory."""
    found = digests(directory)
    write_text(Path(directory) / MANIFEST, "".join(f"{h}  {n}\n" for n, h in found.items()))
    return found


def read_manifest(directory: str | Path, fix: str) -> dict[str, str] | None:
    """{path: sha256} from `directory`'s MANIFEST; None when it has none (written before manifests existed)."""
    f = Path(directory) / MANIFEST
    if not f.is_file():
        return None
    found = {}
    for line in f.read_text(errors="replace").splitlines():
        h, sep, name = line.partition("  ")
        if not sep or not re.fullmatch(r"[0-9a-f]{64}", h) or not name:
            raise HybridlabError(f"checksum file {f} is damaged (line {line[:60]!r}); {fix}")
        found[name] = h
    return found


def verify_manifest(directory: str | Path, fix: str, *, what: str = "file", share: tuple[int, int] = (0, 1)) -> bool:
    """Check every file `directory`'s MANIFEST lists (see `verify_digests`); False when there is no manifest."""
    expected = read_manifest(directory, fix)
    if expected is None:
        return False
    verify_digests(directory, expected, fix, what=what, share=share)
    return True


def rebuild_hint(path: str | Path, default: str = "delete it and rerun `make all`") -> str:
    """How to rebuild a damaged pipeline output: force its job (results/<phase>/<scale>/...), else `default`."""
    parts = Path(path).as_posix().split("/")
    if "results" in parts:
        i = len(parts) - 1 - parts[::-1].index("results")
        rel = parts[i:]
        if len(rel) >= 4:
            target, scale = "/".join(rel), rel[2]
            return (f"rebuild it with `snakemake --force {target} --config scale={scale}` "
                    f"(or delete it and rerun `make all SCALE={scale}`)")
    return default
