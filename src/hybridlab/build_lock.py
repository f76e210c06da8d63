"""Snakemake's lock after a killed build: the next build on the same machine removes it by itself.

Snakemake locks a working directory while it runs (`.snakemake/locks/`) and removes the lock when it
stops, also on Ctrl-C. A SIGKILL (an OOM kill, a power cut, `kill -9`) leaves the lock behind, and every
later `snakemake` / `make all` stops with "Directory cannot be locked" until someone runs
`snakemake --unlock`. Snakemake cannot tell a dead build's lock from a live one's, so the Snakefile
records which process holds it: once the build has started (`onstart`) it writes the owner record (host,
pid, the process's start time), and a new build removes the lock only when all of these hold:

- the record was written on this host (a process on another host cannot be checked),
- no process with that pid and start time is alive (a reused pid has another start time),
- no lock file is newer than the record (a build that has locked but not yet started writes its record
  after its locks, so its fresh locks are never taken for a dead build's).

Anything else leaves the lock to Snakemake, whose own message then applies.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

from hybridlab.atomic import write_text

OWNER = "hybridlab-lock-owner.json"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces; the fields after its closing parenthesis are fixed
    return stat.rpartition(")")[2].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return started is None or _start_time(pid) in (None, started)


def record_owner(workdir: str | Path = ".") -> None:
    """Write the owner record for this process (called from the Snakefile's `onstart`)."""
    meta = Path(workdir) / ".snakemake"
    meta.mkdir(exist_ok=True)
    pid = os.getpid()
    record = {"host": socket.gethostname(), "pid": pid, "started": _start_time(pid)}
    write_text(meta / OWNER, json.dumps(record))


def forget_owner(workdir: str | Path = ".") -> None:
    """Remove this process's owner record (the Snakefile's `onsuccess` / `onerror`)."""
    path = Path(workdir) / ".snakemake" / OWNER
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def clear_stale_lock(workdir: str | Path = ".") -> str | None:
    """Remove a lock whose owner is known to be dead; return a one-line note when it did, else None."""
    meta = Path(workdir) / ".snakemake"
    locks = [p for p in (meta / "locks").glob("*.lock")] if (meta / "locks").is_dir() else []
    if not locks:
        return None
    try:
        owner_path = meta / OWNER
        record = json.loads(owner_path.read_text())
        recorded_at = owner_path.stat().st_mtime_ns
        pid = int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.get("host") != socket.gethostname() or _alive(pid, record.get("started")):
        return None
    if any(p.stat().st_mtime_ns > recorded_at for p in locks):
        return None
    shutil.rmtree(meta / "locks", ignore_errors=True)
    owner_path.unlink(missing_ok=True)
    return (f"note: removed the lock left by a Snakemake build that no longer runs (pid {pid} on this host); "
            "jobs it had started are rerun")
