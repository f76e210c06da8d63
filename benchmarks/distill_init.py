"""Which mixer initialisation and which learning rates distil best, measured on the real teacher (SmolLM2-135M).

    python benchmarks/distill_init.py [--stage1-updates 10] [--stage2-updates 6] [--micro-batch 2]

One placement (default `sandwich` at FA ratio 0.25: 8 full-attention layers, 22 GDN layers of 30), fp32, one
thread. Every number is the held-out KL(teacher || student) in nats per token (the "kl" key of
`hybridlab.train.distill.heldout_curve_metrics`, token-pooled) on the first `--rows-per-language` val rows of
each language of the packed mixture. The project's own machinery does the work, wired as
`hybridlab.pipeline.jobs.train.distill` wires it: `convert_to_hybrid` (one conversion seed for every arm), stage 1 =
`Stage1Task` (teacher inputs; only the mixers train: `freeze_all_but_mixers`; grad_clip off), stage 2 =
`Stage2Task` (the whole student on the logit KL, on the train rows stage 1 never reached:
`sampler.rows_after`), both through `hybridlab.train.loop.train` with `TrainConfig` defaults otherwise
(AdamW, cosine to 0.1 x lr, weight decay 0.1, betas 0.9 / 0.95; stage 2 keeps grad_clip 1.0). Every run of
one stage reads the same train rows in the same order (same seed).

1. Initialisations: short conv random (fla's, `conv_init="random"`), identity (`conv_init="identity"`) or
   none (`use_short_conv=False`) x output gate on / off (`output_gate`): KL after conversion and after a
   stage 1 at `--stage1-lr`. `use_short_conv=False` builds no conv, so the later random draws of each
   mixer (a_proj, b_proj, A_log, dt_bias, g_proj) differ from the conv arms' (same seed, shifted stream);
   random vs identity and gate on vs off draw identically. A second conversion seed of the default
   (`--noise-seed`, stage-1 KL only) shows how much of a difference one seed's draw alone makes.
2. Stage-1 lr sweep (`--stage1-lrs`) on the default init (random conv, gate on), or on the best init when
   its stage-1 KL beats the default's by more than the seed difference of (1) and by >= 1 % relative.
   The run at `--stage1-lr` is reused from (1) (same settings: the run is deterministic).
3. Stage-2 lr sweep (`--stage2-lrs`) from the best stage-1 result of (2).

Prints a table per part and one JSON line (everything, full precision). Missing inputs: one-line error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import torch
from torch.utils.data import Subset

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py
from _common import int_at_least  # noqa: E402

# every project module is imported here, before any run: the processes of a long benchmark do not pick up
# source files edited while it runs
from hybridlab.data.packed_dataset import PackedDataset  # noqa: E402
from hybridlab.models.convert import convert_to_hybrid  # noqa: E402
from hybridlab.models.placements import fa_layers  # noqa: E402
from hybridlab.models.registry import load_causal_lm  # noqa: E402
from hybridlab.train import distill as D  # noqa: E402
from hybridlab.train.config import TrainConfig  # noqa: E402
from hybridlab.train import fsdp, heldout  # noqa: E402,F401  (imported lazily by distill)
from hybridlab.train.loop import train  # noqa: E402
from hybridlab.train.sampler import rows_after  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEACHER = ROOT / "results/models/real/teachers/HuggingFaceTB--SmolLM2-135M-Instruct"
MIXTURE = ROOT / "results/data/real/mixture/smollm2/multilingual"
CONVS = ("random", "identity", "none")
INITS = tuple(f"{conv}/{gate}" for conv in CONVS for gate in ("gate", "nogate"))
DEFAULT_INIT = "random/gate"


def _lr(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"lr {value} must be > 0")
    return value


def _init(text: str) -> str:
    if text not in INITS:
        raise argparse.ArgumentTypeError(f"init {text!r} unknown; use one of {', '.join(INITS)}")
    return text


def init_options(name: str) -> tuple[str | None, dict]:
    """(conv_init, mixer_overrides) of an init name "<random|identity|none>/<gate|nogate>"."""
    conv, gate = name.split("/")
    overrides = {} if gate == "gate" else {"output_gate": False}
    if conv == "none":
        return None, {**overrides, "use_short_conv": False}
    return conv, overrides


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", type=Path, default=TEACHER, help="teacher model directory (%(default)s)")
    p.add_argument("--mixture", type=Path, default=MIXTURE, help="packed mixture directory (%(default)s)")
    p.add_argument("--placement", default="sandwich")
    p.add_argument("--fa-ratio", type=float, default=0.25)
    p.add_argument("--mixer", default="gdn", choices=("gdn", "kda", "gla"))
    p.add_argument("--seed", type=int, default=0, help="conversion seed and data-order seed of every run")
    p.add_argument("--noise-seed", type=int, default=1,
                   help="second conversion seed of the default init (-1: skip)")
    p.add_argument("--updates", "--stage1-updates", dest="stage1_updates", type=int_at_least(1), default=10,
                   help="stage-1 updates per run")
    p.add_argument("--stage2-updates", type=int_at_least(1), default=6)
    p.add_argument("--micro-batch", type=int_at_least(1), default=2, help="rows per update (no accumulation)")
    p.add_argument("--warmup", type=int_at_least(0), default=1, help="warmup updates of both stages")
    p.add_argument("--stage1-lr", type=_lr, default=1e-3, help="lr of the init comparison (part 1)")
    p.add_argument("--stage1-lrs", type=_lr, nargs="*", default=[1e-3, 3e-3, 1e-2])
    p.add_argument("--stage2-lrs", type=_lr, nargs="*", default=[1e-4, 3e-4, 1e-3])
    p.add_argument("--inits", type=_init, nargs="*", default=list(INITS))
    p.add_argument("--rows-per-language", type=int_at_least(1), default=1)
    p.add_argument("--eval-batch-size", type=int_at_least(1), default=4)
    p.add_argument("--kl-chunk-tokens", type=int_at_least(1), default=1024)
    p.add_argument("--threads", type=int_at_least(1), default=1)
    p.add_argument("--teacher-ce", action="store_true", help="also evaluate the teacher's held-out CE (~1 min)")
    args = p.parse_args(argv)
    for what, path, need in (("teacher", args.teacher, "config.json"), ("mixture", args.mixture, "tokens.npy")):
        if not (path / need).is_file():
            sys.exit(f"distill_init.py: {what} {path} not found (no {need}); build it first or pass --{what}")
    if args.warmup > min(args.stage1_updates, args.stage2_updates):
        sys.exit(f"distill_init.py: --warmup {args.warmup} is longer than a stage; lower it")
    return args


class Bench:
    def __init__(self, args):
        self.args = args
        self.teacher = D.freeze(load_causal_lm(args.teacher, dtype=torch.float32))
        self.num_layers = len(D.decoder_layers(self.teacher))
        self.fa = fa_layers(args.placement, self.num_layers, ratio=args.fa_ratio)
        self.train_set = PackedDataset(args.mixture, "train")
        self.eval_ids, self.eval_langs = D.heldout_rows(PackedDataset(args.mixture, "val"), args.rows_per_language)
        self.memo: dict = {}  # the teacher's final hidden states on the held-out rows, computed once

    def evaluate(self, model) -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            return D.heldout_curve_metrics(model, self.teacher, self.eval_ids, self.eval_langs,
                                         self.args.eval_batch_size, self.memo)

    def convert(self, init: str, seed: int | None = None):
        conv_init, overrides = init_options(init)
        return convert_to_hybrid(self.teacher, self.fa, self.args.mixer, seed=self.args.seed if seed is None else seed,
                                 conv_init=conv_init, mixer_overrides=overrides)

    def _train(self, model, task, dataset, stage: int, lr: float) -> dict:
        a = self.args
        run = {"steps": a.stage1_updates if stage == 1 else a.stage2_updates, "micro_batch_size": a.micro_batch,
               "lr": lr, "warmup_steps": a.warmup}
        if stage == 1:
            run["grad_clip"] = None
        with tempfile.TemporaryDirectory(prefix="distill_init_") as tmp:
            cfg = TrainConfig.from_dict({"out_dir": tmp, "seed": a.seed, "seq_len": self.train_set.seq_len,
                                         "precision": "fp32", "device": "cpu", "progress": False,
                                         "final_checkpoint": "weights", "keep_last_k": 1, "log_every": 1, **run})
            t0 = time.perf_counter()
            result = train(model, task, dataset, cfg)
            seconds = time.perf_counter() - t0
            losses = pl.read_parquet(result.metrics_path)["loss"].to_list()
        return {"train_seconds": seconds, "tokens": result.tokens, "first_loss": losses[0], "last_loss": losses[-1]}

    def stage1(self, model, lr: float) -> dict:
        D.freeze_all_but_mixers(model)
        task = D.Stage1Task(self.teacher, model, inputs="teacher")
        try:
            return self._train(model, task, self.train_set, 1, lr)
        finally:
            task.close()  # the hooks on the shared teacher

    def stage2(self, model, lr: float) -> dict:
        for prm in model.parameters():
            prm.requires_grad_(True)
        seen = self.args.stage1_updates * self.args.micro_batch
        rows = rows_after(len(self.train_set), self.args.seed, seen)  # what jobs.stage2_rows gives
        task = D.Stage2Task(self.teacher, chunk_tokens=self.args.kl_chunk_tokens)
        return self._train(model, task, Subset(self.train_set, rows), 2, lr)


def mixer_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if D.MIXER_PARAM_MARK in f".{k}"}


def _row(values: dict, keys: list[str], fmt: str = "{:>12.6f}") -> str:
    return " ".join(fmt.format(values[k]) if isinstance(values.get(k), float) else f"{'-':>12s}" for k in keys)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    wall0 = time.perf_counter()
    bench = Bench(args)
    teacher_eval = bench.evaluate(bench.teacher) if args.teacher_ce else {"ce": None}
    seq_len = bench.train_set.seq_len
    print(f"teacher {args.teacher.name}: {bench.num_layers} layers; placement {args.placement} "
          f"(ratio {args.fa_ratio}): FA layers {bench.fa}, {bench.num_layers - len(bench.fa)} {args.mixer} layers")
    print(f"held-out: {len(bench.eval_langs)} rows x {seq_len} tokens ({args.rows_per_language} per language: "
          f"{', '.join(sorted(set(bench.eval_langs)))})" +
          (f"; teacher CE {teacher_eval['ce']:.6f}" if args.teacher_ce else ""))
    print(f"stage 1: {args.stage1_updates} updates x {args.micro_batch} x {seq_len} tokens, warmup {args.warmup}, "
          f"cosine, grad_clip off; stage 2: {args.stage2_updates} updates x {args.micro_batch} x {seq_len} tokens, "
          f"warmup {args.warmup}, cosine, grad_clip 1.0; fp32, {args.threads} thread(s), seed {args.seed}",
          flush=True)

    # 1. initialisations
    inits: dict[str, dict] = {}
    stage1_states: dict[tuple[str, float], dict] = {}
    arms = [(init, args.seed) for init in args.inits]
    if args.noise_seed >= 0:
        arms.append((DEFAULT_INIT, args.noise_seed))
    for init, seed in arms:
        t0 = time.perf_counter()
        model = bench.convert(init, seed)
        conv = bench.evaluate(model) if seed == args.seed else {"kl": None, "ce": None}  # noise arm: stage 1 only
        train_info = bench.stage1(model, args.stage1_lr)
        after = bench.evaluate(model)
        key = init if seed == args.seed else f"{init}@seed{seed}"
        inits[key] = {"init": init, "seed": seed, "conversion_kl": conv["kl"], "conversion_ce": conv["ce"],
                      "stage1_kl": after["kl"], "stage1_ce": after["ce"], **train_info,
                      "seconds": time.perf_counter() - t0}
        if seed == args.seed:
            stage1_states[(init, args.stage1_lr)] = mixer_state(model)
        conv_text = "-" if conv["kl"] is None else f"{conv['kl']:.6f}"
        print(f"  [{key}] conversion KL {conv_text} -> stage 1 KL {after['kl']:.6f} "
              f"(train loss {train_info['first_loss']:.4f} -> {train_info['last_loss']:.4f}, "
              f"{inits[key]['seconds']:.0f}s)", flush=True)
        del model

    print(f"\n1. initialisation (stage 1 at lr {args.stage1_lr:g})")
    print(f"{'init':20s} {'conv KL':>12s} {'stage1 KL':>12s} {'conv CE':>12s} {'stage1 CE':>12s} {'loss end':>12s}")
    for key, r in inits.items():
        print(f"{key:20s} " + _row(r, ["conversion_kl", "stage1_kl", "conversion_ce", "stage1_ce", "last_loss"]))

    # 2. stage-1 lr sweep on the default init, or on a clearly better one
    chosen, reason = DEFAULT_INIT, "default"
    if DEFAULT_INIT not in inits and inits:  # the default was not measured: the best of those that were
        chosen = min((k for k in inits if "@" not in k), key=lambda k: inits[k]["stage1_kl"])
        reason = f"best of {', '.join(k for k in inits if '@' not in k)} ({DEFAULT_INIT} not measured)"
    elif DEFAULT_INIT in inits:
        base = inits[DEFAULT_INIT]["stage1_kl"]
        noise_key = f"{DEFAULT_INIT}@seed{args.noise_seed}"
        noise = abs(inits[noise_key]["stage1_kl"] - base) if noise_key in inits else 0.0
        best = min((k for k in inits if "@" not in k), key=lambda k: inits[k]["stage1_kl"])
        margin = base - inits[best]["stage1_kl"]
        if best != DEFAULT_INIT and margin > noise and margin >= 0.01 * base:
            chosen, reason = best, (f"beats {DEFAULT_INIT} by {margin:.6f} nat (seed difference {noise:.6f}, "
                                    f"{100 * margin / base:.2f} %)")
        elif best != DEFAULT_INIT:
            reason = f"best {best} beats it by only {margin:.6f} nat (seed difference {noise:.6f})"
    stage1_lr: dict[float, dict] = {}
    for lr in args.stage1_lrs:
        if lr == args.stage1_lr and chosen in inits:
            stage1_lr[lr] = {"stage1_kl": inits[chosen]["stage1_kl"], "stage1_ce": inits[chosen]["stage1_ce"],
                             "last_loss": inits[chosen]["last_loss"], "reused_from_part1": True}
            continue
        t0 = time.perf_counter()
        model = bench.convert(chosen)
        train_info = bench.stage1(model, lr)
        after = bench.evaluate(model)
        stage1_lr[lr] = {"stage1_kl": after["kl"], "stage1_ce": after["ce"], **train_info,
                         "seconds": time.perf_counter() - t0, "reused_from_part1": False}
        stage1_states[(chosen, lr)] = mixer_state(model)
        print(f"  [stage 1 lr {lr:g}] KL {after['kl']:.6f} ({stage1_lr[lr]['seconds']:.0f}s)", flush=True)
        del model
    print(f"\n2. stage-1 lr on {chosen} ({reason})")
    print(f"{'stage1 lr':>10s} {'stage1 KL':>12s} {'stage1 CE':>12s} {'loss end':>12s}")
    for lr, r in stage1_lr.items():
        print(f"{lr:>10g} " + _row(r, ["stage1_kl", "stage1_ce", "last_loss"]) +
              ("  (the part-1 run)" if r["reused_from_part1"] else ""))

    # 3. stage-2 lr sweep from the best stage-1 result of part 2
    stage2_lr: dict[float, dict] = {}
    best_s1 = min(stage1_lr, key=lambda lr: stage1_lr[lr]["stage1_kl"]) if stage1_lr else None
    if best_s1 is not None and args.stage2_lrs:
        state = stage1_states[(chosen, best_s1)]
        for lr in args.stage2_lrs:
            t0 = time.perf_counter()
            model = bench.convert(chosen)
            missing = set(state) - set(model.state_dict())
            assert not missing, missing
            model.load_state_dict(state, strict=False)
            train_info = bench.stage2(model, lr)
            after = bench.evaluate(model)
            stage2_lr[lr] = {"stage2_kl": after["kl"], "stage2_ce": after["ce"], **train_info,
                             "seconds": time.perf_counter() - t0}
            print(f"  [stage 2 lr {lr:g}] KL {after['kl']:.6f} ({stage2_lr[lr]['seconds']:.0f}s)", flush=True)
            del model
        print(f"\n3. stage-2 lr from {chosen}, stage-1 lr {best_s1:g} (stage-1 KL "
              f"{stage1_lr[best_s1]['stage1_kl']:.6f})")
        print(f"{'stage2 lr':>10s} {'stage2 KL':>12s} {'stage2 CE':>12s} {'loss end':>12s}")
        for lr, r in stage2_lr.items():
            print(f"{lr:>10g} " + _row(r, ["stage2_kl", "stage2_ce", "last_loss"]))

    wall = time.perf_counter() - wall0
    print(f"\nwall time {wall:.1f}s")
    print(json.dumps({
        "benchmark": "distill_init", "teacher": str(args.teacher), "mixture": str(args.mixture),
        "placement": args.placement, "fa_ratio": args.fa_ratio, "fa_layers": bench.fa, "mixer": args.mixer,
        "num_layers": bench.num_layers, "seed": args.seed, "noise_seed": args.noise_seed,
        "stage1_updates": args.stage1_updates, "stage2_updates": args.stage2_updates,
        "micro_batch": args.micro_batch, "seq_len": seq_len, "warmup": args.warmup, "threads": args.threads,
        "heldout_rows": len(bench.eval_langs), "teacher_ce": teacher_eval["ce"], "stage1_lr_part1": args.stage1_lr,
        "init": inits, "stage1_lr_init": chosen, "stage1_lr_init_reason": reason,
        "stage1_lr": {str(k): v for k, v in stage1_lr.items()},
        "stage2_from_stage1_lr": best_s1, "stage2_lr": {str(k): v for k, v in stage2_lr.items()},
        "wall_seconds": wall,
    }, sort_keys=True))


if __name__ == "__main__":
    main()
