"""Shared glue for workflow scripts: import path, one-line user errors, JSON params.

Rules call `python workflow_scripts/<name>.py --params '<json>' ...`. Scripts stay thin: parse
arguments, call their rule's job in `hybridlab.pipeline.jobs`. A `HybridlabError` becomes one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Make `import hybridlab` work in any environment Snakemake runs us in (venv or a conda env that only
# holds the dependencies), without installing the package there.
_SRC = Path(__file__).resolve().parent.parent / "src"
if str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

from hybridlab.atomic import disk_full  # noqa: E402
from hybridlab.errors import HybridlabError  # noqa: E402
from hybridlab.heap import retain_freed_memory  # noqa: E402
from hybridlab.pipeline.jobs.train import is_main  # noqa: E402


def parser(description: str, params: str | type | None = None) -> argparse.ArgumentParser:
    """The script's parser with the required `--params`; `--help` shows `description` as written and, when
    given, what `--params` holds as the epilog: the keys of a job's section (a `job_sections` class, through
    `describe_job`) or a text."""
    if isinstance(params, type):
        from hybridlab.config_spec import describe_job

        params = describe_job(params)
    p = argparse.ArgumentParser(description=description, epilog=params,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", required=True, help="JSON object of rule parameters (keys: see below)"
                   if params else "JSON object of rule parameters")
    return p


def load_job(cls, text: str):
    """`--params` as the job's typed section (`hybridlab.config_spec.job_settings`: one line on a wrong key)."""
    from hybridlab.config_spec import job_settings

    return job_settings(cls, load_params(text), Path(sys.argv[0]).name)


def load_params(text: str) -> dict:
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HybridlabError(f"--params is not valid JSON ({exc.msg} at char {exc.pos}); pass a JSON object")
    if not isinstance(params, dict):
        raise HybridlabError("--params must be a JSON object")
    return params


def set_threads(threads: int | None) -> None:
    """`torch.set_num_threads(threads)` unless None (then torch's choice), for a script's --threads."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _provenance() -> None:
    """After a successful run, record what made `--out` (or a figure's --out-png / a table's --out-csv)."""
    p = argparse.ArgumentParser(add_help=False)
    for flag in ("--out", "--out-png", "--out-csv"):
        p.add_argument(flag)
    p.add_argument("--params")
    args, _ = p.parse_known_args()
    outs = [o for o in (args.out, args.out_png, args.out_csv) if o and Path(o).exists()]
    if not outs:
        return
    from hybridlab import provenance

    params = json.loads(args.params) if args.params else {}
    for out in outs:
        provenance.write(out, params, Path(sys.argv[0]).name, _SRC.parent)


def run(main) -> None:
    """Call `main()`, then write provenance for `--out`; user errors and a full disk become one line + exit
    code 1. Freed memory stays in the process (`hybridlab.heap`: no page faults for each update's fresh
    tensors)."""
    retain_freed_memory()
    try:
        main()
        if is_main():  # under torchrun every rank runs main(); rank 0 alone writes outputs
            _provenance()
    except HybridlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except OSError as exc:  # a write outside the atomic writers that found the disk full
        if not disk_full(exc):
            raise
        where = f" writing {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"error: no space left on device{where}; free space and rerun the same command", file=sys.stderr)
        sys.exit(1)
