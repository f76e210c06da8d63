"""The `hybridlab` command line: small helpers around the Snakemake pipeline.

    hybridlab config [--configfile config.yaml] [--scale tiny] [--resolved]   # validate + print the preset
    hybridlab placements --scheme sandwich --layers 36 --ratio 0.25
    hybridlab languages                                            # the language registry
    hybridlab cache pull [TARGETS]                                 # dvc pull + mark outputs complete
    hybridlab plan --scale paper [--gpu-mem-gb 80] [--gpus N] [--json]   # GPU, host RAM, disk and time per job

Every user error is one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hybridlab.config import SCALES
from hybridlab.errors import HybridlabError


def _cmd_config(args) -> None:
    from hybridlab import config as cfg

    overrides = {"scale": args.scale} if args.scale else None
    from hybridlab.data.local_sources import check_paths

    raw = cfg.load(args.configfile, overrides)
    view = cfg.resolve(raw)
    check_paths(view, root=Path(args.configfile).parent)
    if args.resolved:
        print(json.dumps({"config_hash": cfg.config_hash(view), **view}, indent=2))
        return
    # as written: a derived preset's own keys, with the presets it derives from (nearest first)
    import yaml

    written = yaml.safe_load(Path(args.configfile).read_text())
    scale, chain = view["scale"], []
    while (parent := written["presets"][chain[-1] if chain else scale].get(cfg.DERIVES_FROM)) is not None:
        chain.append(parent)
    print(json.dumps({"config_hash": cfg.config_hash(view), "scale": scale, "derives_from": chain,
                      "preset": written["presets"][scale]}, indent=2))


def _cmd_placements(args) -> None:
    from hybridlab.models.placements import fa_layers, placement_diagram

    indices = [int(i) for i in args.indices.split(",")] if args.indices else None
    fa = fa_layers(args.scheme, args.layers, ratio=args.ratio, indices=indices)
    types = ["full_attention" if i in fa else "mixer" for i in range(args.layers)]
    print(f"{args.scheme}: FA layers {fa}")
    print(placement_diagram(types))


def _cmd_languages(args) -> None:
    from hybridlab.data.languages import DATASETS, LANGUAGES

    print("code\tname\t" + "\t".join(DATASETS))
    for code, lang in sorted(LANGUAGES.items()):
        names = [getattr(lang, attr) or "-" for _, attr in DATASETS.values()]
        print(f"{code}\t{lang.name}\t" + "\t".join(names))


def _cmd_cache_pull(args) -> None:
    from hybridlab.cache import pull

    report = pull(args.targets, repo=args.repo, scale=args.scale, remote=args.remote, jobs=args.jobs,
                  force=args.force)
    print(report.summary())


def _cmd_plan(args) -> None:
    from hybridlab import config as cfg
    from hybridlab.pipeline.cluster.disk_plan import disk_preset, format_disk
    from hybridlab.pipeline.cluster.plan import format_table, plan_preset, plans_json

    overrides = {"scale": args.scale} if args.scale else None
    raw = cfg.load(args.configfile, overrides)
    plans = plan_preset(raw, gpu_mem_gb=args.gpu_mem_gb, gpus=args.gpus)
    disks = disk_preset(raw)
    # per rule: host RAM, disk and time next to GPU memory (the requests the rules make)
    from hybridlab.pipeline.cluster.resources import cluster_settings, format_resources, refused, rule_resources

    # the requests are for each job's smallest fitting GPU count, whatever --gpus asks the verdict for
    resources = rule_resources(raw, plans if args.gpus is None else plan_preset(raw, gpu_mem_gb=args.gpu_mem_gb))
    cluster = cluster_settings(cfg.resolve(raw))
    if args.json:
        out = json.loads(plans_json(plans, args.gpu_mem_gb))
        out["disk"] = [{"job": p.job, "runs": p.runs, "checkpoint_bytes": p.checkpoint_bytes, "kept": p.kept,
                        "final_checkpoint_bytes": p.final_checkpoint, "final_bytes": p.final_bytes,
                        "peak_bytes": p.per_run, "left_bytes": p.at_rest, "total_bytes": p.total} for p in disks]
        out["rules"] = [{"rule": r.rule, "gpus": r.gpus, "gpu_peak_bytes": r.gpu_peak_bytes, "host_bytes": r.host_bytes,
                         "mem_mb": r.mem_mb, "disk_bytes": r.disk_bytes, "disk_mb": r.disk_mb, "minutes": r.minutes,
                         "runtime": r.runtime, "attempts": r.attempts, "fixed": r.fixed, "basis": r.basis}
                        for r in resources.values()]
        print(json.dumps(out, indent=1))
    else:
        print(format_table(plans, args.gpu_mem_gb) + "\n\n" + format_disk(disks) + "\n\n"
              + format_resources(resources, cluster, cfg.resolve(raw)["scale"]))
    line = refused(resources, cluster, cfg.resolve(raw)["scale"])
    if line:
        raise HybridlabError(line)


def _plan_number(kind):
    def parse(text):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error form: one line naming the problem and where help is, exit code 1."""

    def error(self, message: str):
        self.exit(1, f"error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hybridlab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    c = sub.add_parser("config", help="validate config.yaml and print a preset as written (--resolved: in full)")
    c.add_argument("--configfile", default="config.yaml")
    c.add_argument("--scale", choices=list(SCALES))
    c.add_argument("--resolved", action="store_true",
                   help="print the whole resolved preset (inherited keys and defaults included) instead")
    c.set_defaults(func=_cmd_config)

    pl = sub.add_parser("placements", help="print the full-attention layers of a placement")
    pl.add_argument("--scheme", required=True)
    pl.add_argument("--layers", type=int, required=True)
    pl.add_argument("--ratio", type=float)
    pl.add_argument("--indices", help="explicit comma-separated FA layer indices (scheme 'explicit')")
    pl.set_defaults(func=_cmd_placements)

    lg = sub.add_parser("languages", help="list the language registry")
    lg.set_defaults(func=_cmd_languages)

    ca = sub.add_parser("cache", help="share pipeline results through DVC")
    csub = ca.add_subparsers(dest="cache_command", metavar="SUBCOMMAND", required=True, parser_class=_Parser)
    cp = csub.add_parser("pull", help="dvc pull the cached phases of TARGETS and mark them complete for Snakemake")
    cp.add_argument("targets", nargs="*", default=["all"], help="Snakemake targets (default: all)")
    cp.add_argument("--scale", choices=list(SCALES), help="must equal config.yaml's scale")
    cp.add_argument("-r", "--remote", help="DVC remote (default: the repository's default remote)")
    cp.add_argument("-j", "--jobs", type=int, help="parallel DVC downloads")
    cp.add_argument("-f", "--force", action="store_true", help="overwrite local changes to pulled outputs")
    cp.add_argument("--repo", default=".", help="repository root (default: .)")
    cp.set_defaults(func=_cmd_cache_pull)

    pn = sub.add_parser("plan", help="estimated peak GPU memory per rank of every job, the GPUs it needs, and each rule's "
                                        "host RAM, disk and time")
    pn.add_argument("--configfile", default="config.yaml")
    pn.add_argument("--scale", choices=list(SCALES))
    pn.add_argument("--gpu-mem-gb", type=_plan_number(float), default=80.0, help="memory of one GPU (default 80)")
    pn.add_argument("--gpus", type=_plan_number(int), help="give the verdict for this many GPUs per job")
    pn.add_argument("--json", action="store_true", help="machine-readable output")
    pn.set_defaults(func=_cmd_plan)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except HybridlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
