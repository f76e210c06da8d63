"""`hybridlab cache pull`: fetch cached pipeline results with DVC and make Snakemake accept them.

Definitions (this project's; see README, "Sharing results with DVC"):

- A *stage* is a stage of dvc.yaml. There is one per phase (`PHASES`); its `cmd` runs the phase's
  Snakemake target and its out is `results/<phase>/<scale>`, with `scale` templated from config.yaml.
- A stage is *cached* when dvc.lock records it (`dvc commit` or `dvc repro` after a build, then
  `dvc push`). Only cached stages are pulled; the rest is left for Snakemake to build.
- A pulled stage is *fresh* when `dvc status` reports nothing for it after the pull: this checkout's
  code, params and upstream outputs are the ones its outputs were built from. A stale stage is an
  error, because marking its outputs complete would hide that they belong to other code.

Why pulling is more than `dvc pull`: DVC restores contents, not mtimes, and a fresh clone has no
`.snakemake/metadata`. Snakemake 9 reruns a job whenever an input is newer than its oldest output
and the input's checksum is not the one recorded in that metadata - always, whatever
`--rerun-triggers` says - so after a bare `dvc pull` it rebuilds whatever DVC happened to write
first. `snakemake --touch --forceall <pulled outputs>` touches every output in DAG order and records
the metadata (params, code, input checksums) of each job, exactly as a local build would have: a
dry run then has nothing to do, deleting one output rebuilds only that job, and later changes to
params or code trigger reruns as usual. Jobs whose outputs were not cached are not touched.

Interrupted pulls: a pull records the stages it fetches in `.dvc/tmp/hybridlab-cache-pull.json` and
removes the record when it has finished; a rerun that finds the record completes the pull, letting DVC
overwrite the files the interrupted one left half-written (a bare `dvc pull` refuses them as "unsaved").
Checksums: DVC does not check what it restores against dvc.lock by default (neither a download nor a
damaged local cache object), so after the pull every file of the pulled stages is hashed against dvc.lock
(`verify_pulled`); a mismatch is one line, and the file and its damaged cache object are removed so that a
rerun fetches it again.

All DVC calls run one after another (DVC allows one process per repository at a time).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import yaml

from hybridlab.atomic import rebuild_hint, write_text
from hybridlab.errors import HybridlabError

PHASES = ("data", "models", "train", "eval", "figures")
SCALES = ("smoke", "tiny", "paper")
# The cores a plain local `snakemake` run gets from profiles/default: rules may size threads from
# `workflow.cores`, and the DAG must be parsed the same way as by the run that comes next.
_CORES = ("--cores", "all")
# Written when a pull starts, removed when it has finished: its presence means the last pull was interrupted.
PULL_RECORD = Path(".dvc") / "tmp" / "hybridlab-cache-pull.json"


@dataclass(frozen=True)
class PullReport:
    """What `pull` did: stages fetched, stages with no cache, jobs Snakemake would still run."""

    scale: str
    pulled: list[str]
    not_cached: list[str]
    n_marked: int
    to_build: dict[str, int] = field(default_factory=dict)
    resumed: bool = False
    n_verified: int = 0

    def summary(self) -> str:
        lines = [f"pulled stages ({self.scale}): {', '.join(self.pulled)}; "
                 f"{self.n_marked} output files marked complete for Snakemake"]
        if self.resumed:
            lines.append("completed an interrupted pull")
        if self.n_verified:
            lines.append(f"{self.n_verified} pulled files match their checksums in dvc.lock")
        if self.not_cached:
            lines.append(f"not in dvc.lock (Snakemake builds them): {', '.join(self.not_cached)}")
        if self.to_build:
            jobs = ", ".join(f"{rule} x{n}" for rule, n in self.to_build.items())
            lines.append(f"still to build: {jobs}")
        else:
            lines.append("nothing left to build for the requested targets")
        return "\n".join(lines)


def phases_for(targets: Sequence[str]) -> list[str]:
    """The phases (= DVC stages) whose outputs a set of Snakemake targets depends on, in DAG order.

    A phase target (`models`) or a path under `results/<phase>/` needs that phase and every earlier
    one; any other target (`all`, a figure rule) may need every phase.
    """
    if not targets:
        raise HybridlabError("no Snakemake targets given; name at least one (e.g. `all` or `data`)")
    last = -1
    for target in targets:
        phase = target
        if target.startswith("results/"):
            parts = target.split("/")
            phase = parts[1] if len(parts) > 1 else ""
            if phase not in PHASES:
                raise HybridlabError(f"target {target!r} is not under results/<phase>/ for a phase in "
                                     f"{', '.join(PHASES)}; name a phase target or an output path")
        last = max(last, PHASES.index(phase) if phase in PHASES else len(PHASES) - 1)
    return list(PHASES[: last + 1])


def config_scale(repo: Path) -> str:
    """The `scale` set in config.yaml: the preset that dvc.yaml (and so dvc.lock) is templated on."""
    path = Path(repo) / "config.yaml"
    if not path.is_file():
        raise HybridlabError(f"{path} not found; run this from the repository root or pass --repo")
    scale = (yaml.safe_load(path.read_text()) or {}).get("scale")
    if scale not in SCALES:
        raise HybridlabError(f"config.yaml: scale = {scale!r}; set it to one of {', '.join(SCALES)}")
    return scale


def locked_stages(repo: Path) -> list[str]:
    """Stages that dvc.lock records (cached by `dvc commit`/`dvc repro`), in dvc.yaml order."""
    lock = Path(repo) / "dvc.lock"
    if not lock.is_file():
        return []
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages") or {}
    return [name for name in _dvc_yaml(repo) if name in stages]


def stage_targets(repo: Path, stages: Sequence[str]) -> list[str]:
    """The Snakemake targets each stage's `cmd` builds (`snakemake data --config ...` -> `data`)."""
    spec = _dvc_yaml(repo)
    targets: list[str] = []
    for name in stages:
        argv = shlex.split(str(spec[name].get("cmd", "")))
        if "snakemake" not in argv:
            raise HybridlabError(f"dvc.yaml: stage {name!r} does not run snakemake (cmd: {spec[name].get('cmd')!r});"
                                 " each stage must run its phase's Snakemake target")
        rest = argv[argv.index("snakemake") + 1:]
        named = list(_positional_prefix(rest))
        if not named:
            raise HybridlabError(f"dvc.yaml: stage {name!r} names no Snakemake target in its cmd")
        targets += [t for t in named if t not in targets]
    return targets


def stale_stages(repo: Path, stages: Sequence[str]) -> dict[str, list[str]]:
    """`dvc status` of the given stages: stage -> changes (empty dict when every stage is fresh)."""
    out = _run([sys.executable, "-m", "dvc", "status", "--json", *stages], repo, "dvc status").stdout
    start = out.find("{")
    status = json.loads(out[start:]) if start >= 0 else {}
    return {stage: [_describe(entry) for entry in entries] for stage, entries in status.items() if entries}


def dvc_pull(repo: Path, stages: Sequence[str], remote: str | None = None, jobs: int | None = None,
             force: bool = False) -> None:
    """`dvc pull` of the given stages' outputs from the default remote (or `remote`)."""
    cmd = [sys.executable, "-m", "dvc", "pull", *stages]
    if remote:
        cmd += ["--remote", remote]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    if force:
        cmd.append("--force")
    _run(cmd, repo, "dvc pull")


def complete_outputs(repo: Path, targets: Sequence[str], scale: str) -> list[str]:
    """Output files of the jobs under `targets` whose outputs all exist on disk (`snakemake --summary`).

    Jobs are told apart by rule and log file (every rule here has a log); a job with any output
    missing is left out, so Snakemake still builds it - and touching it would create its log file
    inside a DVC out, which `dvc status` would then report as modified.
    """
    proc = _run([sys.executable, "-m", "snakemake", "--summary", *targets, *_CORES,
                 "--config", f"scale={scale}"], repo, "snakemake --summary")
    lines = proc.stdout.splitlines()
    header = next((i for i, ln in enumerate(lines) if ln.startswith("output_file\t")), None)
    if header is None:
        raise HybridlabError("snakemake --summary printed no table; run it by hand to see why")
    jobs: dict[tuple[str, str], list[str]] = {}
    for line in lines[header + 1:]:
        cols = line.split("\t")
        if len(cols) >= 4:
            jobs.setdefault((cols[2], cols[3]), []).append(cols[0])
    return [f for outs in jobs.values() if all((Path(repo) / f).exists() for f in outs) for f in outs]


def mark_complete(repo: Path, outputs: Sequence[str], scale: str) -> None:
    """Touch `outputs` (and their upstream outputs) in DAG order and record Snakemake metadata.

    `--forceall` makes every job of the sub-DAG a touch job, so each output ends up newer than its
    inputs and each job gets the metadata record (params, code, input checksums) a build writes.
    """
    if outputs:
        _run([sys.executable, "-m", "snakemake", *outputs, "--touch", "--forceall", *_CORES,
              "--config", f"scale={scale}"], repo, "snakemake --touch")


def pending_jobs(repo: Path, targets: Sequence[str], scale: str, extra: Sequence[str] = ()) -> dict[str, int]:
    """Jobs per rule that `snakemake -n <targets>` would run ({} when there is nothing to do)."""
    proc = _run([sys.executable, "-m", "snakemake", "-n", *targets, *_CORES, "--config", f"scale={scale}",
                 *extra], repo, "snakemake --dry-run")
    return parse_job_stats(proc.stdout + proc.stderr)


def parse_job_stats(text: str) -> dict[str, int]:
    """Rule -> job count from Snakemake's "Job stats" table; {} for "Nothing to be done"."""
    if "Job stats:" not in text:
        if "Nothing to be done" in text:
            return {}
        raise HybridlabError("snakemake printed neither a job table nor 'Nothing to be done'; run the dry run "
                             "by hand to see why")
    counts: dict[str, int] = {}
    for line in text.split("Job stats:", 1)[1].splitlines()[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def pull(targets: Sequence[str] = ("all",), *, repo: str | Path = ".", scale: str | None = None,
         remote: str | None = None, jobs: int | None = None, force: bool = False) -> PullReport:
    """`dvc pull` the cached stages that `targets` depend on, check them fresh, mark them complete.

    `scale` must be config.yaml's (dvc.yaml is templated on it); None means "whatever it says".
    Raises HybridlabError when nothing is cached, the scale differs, or a pulled stage is stale.
    """
    repo = Path(repo).resolve()
    if not (repo / "dvc.yaml").is_file() or not (repo / ".dvc").is_dir():
        raise HybridlabError(f"{repo} has no dvc.yaml/.dvc; run this from the repository root or pass --repo")
    configured = config_scale(repo)
    if scale is not None and scale != configured:
        raise HybridlabError(f"dvc.lock holds the preset set in config.yaml (scale: {configured}), not "
                             f"{scale}; set `scale: {scale}` in config.yaml (as the commit that cached it did) "
                             "and rerun")
    scale = configured
    wanted = phases_for(targets)
    locked = set(locked_stages(repo))
    stages = [p for p in wanted if p in locked]
    if not stages:
        raise HybridlabError(f"dvc.lock records none of the stages {', '.join(wanted)}; build them with "
                             "Snakemake and cache them (`dvc commit` + `dvc push`), or check out a commit "
                             "whose dvc.lock has them")

    record = repo / PULL_RECORD
    resumed = record.is_file()
    write_text(record, json.dumps({"stages": stages}) + "\n")
    try:
        dvc_pull(repo, stages, remote=remote, jobs=jobs, force=force or resumed)
    except HybridlabError as exc:
        if not resumed and "unsaved files" in str(exc):  # the user's own changes, not an interrupted pull's
            record.unlink(missing_ok=True)
            raise HybridlabError(f"{exc}; these are local changes to pulled outputs: rerun with --force to "
                                 "replace them with the cached ones") from exc
        raise
    n_verified = verify_pulled(repo, stages)
    stale = stale_stages(repo, stages)
    if stale:
        detail = "; ".join(f"{stage}: {', '.join(changes)}" for stage, changes in stale.items())
        raise HybridlabError(f"pulled outputs do not match this checkout ({detail}); check out the commit that "
                             "produced dvc.lock, or rebuild those phases with Snakemake (--forcerun)")
    outputs = complete_outputs(repo, stage_targets(repo, stages), scale)
    mark_complete(repo, outputs, scale)
    record.unlink(missing_ok=True)
    return PullReport(scale=scale, pulled=stages, not_cached=[p for p in wanted if p not in locked],
                      n_marked=len(outputs), to_build=pending_jobs(repo, targets, scale), resumed=resumed,
                      n_verified=n_verified)


def verify_pulled(repo: Path, stages: Sequence[str]) -> int:
    """Hash every file of the stages' outs (DVC 3 md5 entries of dvc.lock) against dvc.lock; returns the count.

    A mismatch removes the file and, when its cache object is damaged too, that object (so a rerun fetches it
    again), then raises one line naming the file.
    """
    repo = Path(repo)
    lock = (yaml.safe_load((repo / "dvc.lock").read_text()) or {}).get("stages") or {}
    cache_dir = _cache_dir(repo)
    n = 0
    for stage in stages:
        for out in lock.get(stage, {}).get("outs") or []:
            if out.get("hash") != "md5" or not out.get("md5"):
                continue  # DVC 2 entries (md5 of text files with unix line ends) are not recomputed here
            path, want = repo / out["path"], out["md5"]
            if not want.endswith(".dir"):
                _check_pulled(repo, path, want, cache_dir)
                n += 1
                continue
            listing = _object(cache_dir, want)
            if not listing.is_file() or _md5(listing) != want.removesuffix(".dir"):
                if listing.is_file():
                    _drop(listing)
                raise HybridlabError(f"the cached listing of {out['path']} ({listing}) is missing or damaged; "
                                     "rerun `hybridlab cache pull` to fetch it again")
            for entry in json.loads(listing.read_text()):
                _check_pulled(repo, path / entry["relpath"], entry["md5"], cache_dir)
                n += 1
    return n


def _check_pulled(repo: Path, path: Path, want: str, cache_dir: Path) -> None:
    rel = path.relative_to(repo).as_posix()
    if not path.is_file():
        raise HybridlabError(f"pulled file {rel} is missing after `dvc pull`; rerun `hybridlab cache pull`")
    got = _md5(path)
    if got == want:
        return
    obj = _object(cache_dir, want)
    if obj.is_file() and not obj.samefile(path) and _md5(obj) == want:
        detail = "the workspace copy is damaged"
    else:
        detail = "its cache object is damaged, removed"
        if obj.is_file():
            _drop(obj)
    _drop(path)
    raise HybridlabError(f"pulled file {rel} does not match its checksum in dvc.lock (md5 {got} != {want}; {detail}); "
                         "it was removed: rerun `hybridlab cache pull` to fetch it again, and if this repeats the "
                         f"remote's copy is damaged: {rebuild_hint(rel)}, then `dvc commit` + `dvc push`")


def _cache_dir(repo: Path) -> Path:
    out = _run([sys.executable, "-m", "dvc", "cache", "dir"], repo, "dvc cache dir").stdout.strip().splitlines()
    return Path(out[-1]) if out else Path(repo) / ".dvc" / "cache"


def _object(cache_dir: Path, md5: str) -> Path:
    return Path(cache_dir) / "files" / "md5" / md5[:2] / md5[2:]


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _drop(path: Path) -> None:
    try:
        path.chmod(0o644)  # DVC makes cache objects read-only
    except OSError:
        pass
    path.unlink(missing_ok=True)


def _dvc_yaml(repo: Path) -> dict:
    path = Path(repo) / "dvc.yaml"
    if not path.is_file():
        raise HybridlabError(f"{path} not found; run this from the repository root or pass --repo")
    return (yaml.safe_load(path.read_text()) or {}).get("stages") or {}


def _positional_prefix(argv: Sequence[str]):
    # Targets come before the first option (`snakemake data --config scale=...`).
    for arg in argv:
        if arg.startswith("-"):
            return
        yield arg


def _describe(entry) -> str:
    if isinstance(entry, str):
        return entry
    parts = []
    for kind, changes in entry.items():
        if isinstance(changes, dict):
            changed = ", ".join(f"{path} {what if isinstance(what, str) else 'changed'}"
                                for path, what in changes.items())
        else:
            changed = str(changes)
        parts.append(f"{kind} {changed}")
    return "; ".join(parts)


def _run(cmd: list[str], cwd: Path, what: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "no output")
        raise HybridlabError(f"{what} failed in {cwd} (exit {proc.returncode}): {last.strip()}")
    return proc
