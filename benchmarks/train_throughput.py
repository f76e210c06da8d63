"""Training throughput (tokens/s) and model FLOP utilisation (MFU) of the tiny preset's training steps on CPU.

What is timed: one optimiser update of the project's own loop (`hybridlab.train.loop.train`: sampling,
collation, the task's loss, backward, gradient norm and clipping, AdamW step, metrics rows at the
pipeline's `log_every`), built exactly as the pipeline builds it, for

- `teacher`: the dense Qwen3 teacher of `models.teacher` (vocabulary `data.tokenizer_vocab_size`, tied
  embeddings) on `CausalLMTask` with the `train.teacher` settings (micro-batch x `data.seq_len` tokens);
- `student`: distillation stage 2 of the hybrid converted from that teacher with the
  `standard_periodic` placement (`experiments.distill.fa_ratio`) and the GDN mixer: `Stage2Task`, i.e.
  the frozen teacher's forward plus the chunked KL(teacher || student) of the logits, with the
  `train.distill.stage2` settings and `kl_chunk_tokens` / `kl_vocab_chunk`;
- `smollm2_forward` / `smollm2_stage2` (run when named in `--only`): the real preset's shapes, a
  SmolLM2-135M-shaped Llama (30 layers, hidden 576, 9/3 heads of 64, vocabulary 49,152): its forward with
  logits, and distillation stage 2 of its reverse-periodic GDN student, on 4 x 512-token rows in fp32;
- `spaced_retrieval`: the BLD Spaced Retrieval hybrid (`experiments.bld_sr` pattern and mixer, KDA:
  attention 2:2, `train.bld_sr.model` shape) on `SpacedRetrievalTask` with the `train.bld_sr` settings,
  on a train split drawn with the preset's `data.spaced_retrieval` gap mix.

Weights are freshly initialised and the natural-language rows are uniform random token ids: the cost of
a step does not depend on either. Evaluation and checkpoints are switched off (`eval_fn=None`,
`ckpt_every=None`); everything else is the pipeline's configuration. A hook on the loop's
`on_step_start` records the wall time at the start of every update and counts each micro-batch's
tokens (the task's `num_tokens`) and FLOPs; after `--warmup` untimed and `--steps` timed updates it
stops the run. Reported per benchmark: the median update time, and the medians over the timed
updates of tokens/s and achieved GFLOP/s; MFU = achieved GFLOP/s / measured matmul GFLOP/s.

Matmul throughput: fp32 square GEMMs of 1024 and 2048 at the same thread count, measured before and
after the model benchmarks; the best of all is the reference (a conservative MFU denominator).

FLOPs counted (2 per multiply-add; "useful" work only, nothing the implementation recomputes):

- every `nn.Linear` weight once per token: all projections of attention, mixers and MLPs, the mixers'
  gate and low-rank projections, and the LM head (with tied embeddings the head is still a matmul; the
  embedding lookup is not). Forward 2 N per token, forward + backward 6 N per token.
- full-attention layers, causal: per sequence of n tokens and layer, Q K^T and A V over the
  n (n + 1) / 2 (query, key) pairs that are not masked, 2 x 2 x heads x head_dim FLOPs per pair forward
  (x 3 for forward + backward).
- recurrent mixers: the matmul FLOPs of the project's chunked op (`_common.chunked_op_matmul_flops`;
  every op's hand-written backward = 2 x forward) over ceil(n / chunk) chunks per
  sequence and head. Depthwise short convolutions, norms, gates' element-wise work, softmax, the
  triangular inverses and the optimiser are not counted.
- `student`: the student's forward + backward plus the frozen teacher's forward (2 N + attention, the
  teacher's LM head included) as useful work; the chunked KL recomputes both heads' logits in its
  second forward pass and in backward, which is not counted.
- `spaced_retrieval`: each micro-batch runs one forward per sequence length (`by_length`), so its
  FLOPs are summed over the real lengths; its tokens are the non-padding tokens.

Targets: teacher step and SmolLM2 forward >= 35 %, hybrid student step and SmolLM2 stage 2 >= 25 % of the
matmul throughput (docs/performance.md).
Why a target is met or missed on this CPU: after the table, each of these two steps' `nn.Linear`
GEMMs are timed alone at the step's own shapes (`linear_gemm_time`): their rate against the reference, the
part of the update they take at that rate, and, for a missed target, how much faster the rest of the update
(attention, mixers, element-wise work, optimiser, overhead) would have to be.
The last printed line is one JSON object with every figure.

    python benchmarks/train_throughput.py [--steps 5] [--warmup 2] [--threads 2] [--scale tiny]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from _common import best_seconds, chunked_op_matmul_flops, int_at_least, measure_matmul_gflops
from _machine import describe, describe_line
from hybridlab.config import load, resolve
from hybridlab.errors import HybridlabError
from hybridlab.train.config import TrainConfig
from hybridlab.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("teacher", "student", "spaced_retrieval", "smollm2_forward", "smollm2_stage2")
DEFAULT = ("teacher", "student", "spaced_retrieval")  # the SmolLM2 workloads run when named (--only)
# minimum MFU (docs/performance.md, "Targets")
TARGETS = {"teacher": 0.35, "student": 0.25, "smollm2_forward": 0.35, "smollm2_stage2": 0.25}
# SmolLM2-135M-Instruct's shape (the real preset's teacher) and the real preset's rows: 4 x 512 tokens
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               head_dim=64, intermediate_size=1536, tie_word_embeddings=True, rope_theta=100000.0,
               max_position_embeddings=8192)
SMOLLM2_ROWS = (4, 512)
STUDENT_PLACEMENT, STUDENT_MIXER = "standard_periodic", "gdn"


# ---- FLOP counting ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlopCounter:
    """Analytic FLOPs of one transformers causal LM (dense or hybrid); see the module docstring."""

    linear_params: int
    attention_layers: int
    heads: int
    head_dim: int
    mixer: str | None = None
    mixer_layers: int = 0
    mixer_heads: int = 0
    mixer_k: int = 0
    mixer_v: int = 0
    chunk: int = 1

    @classmethod
    def of(cls, model: nn.Module) -> "FlopCounter":
        config = model.config.get_text_config(decoder=True)
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
        spec = getattr(model, "hybridlab_spec", None)
        if spec is None:
            return cls(linear, config.num_hidden_layers, heads, head_dim)
        mc = spec.mixer_config
        return cls(linear, len(spec.fa_layers), heads, head_dim, spec.mixer_kind, len(spec.mixer_layers),
                   mc["num_heads"], mc["head_k_dim"], mc["head_v_dim"], mc["chunk_size"])

    def _per_sequence(self, n: int) -> tuple[float, float]:
        """(forward, forward + backward) FLOPs of one sequence of n tokens."""
        linear = 2 * self.linear_params * n
        attention = self.attention_layers * 2 * 2 * self.heads * self.head_dim * n * (n + 1) / 2
        fwd, fwdbwd = linear + attention, 3 * (linear + attention)
        if self.mixer is not None:
            chunks = self.mixer_layers * self.mixer_heads * math.ceil(n / self.chunk)
            op_fwd, op_fwdbwd = chunked_op_matmul_flops(self.mixer, chunks, self.mixer_k, self.mixer_v, self.chunk)
            fwd, fwdbwd = fwd + op_fwd, fwdbwd + op_fwdbwd
        return fwd, fwdbwd

    def forward(self, lengths: Sequence[int]) -> float:
        return sum(self._per_sequence(int(n))[0] for n in lengths)

    def train(self, lengths: Sequence[int]) -> float:
        return sum(self._per_sequence(int(n))[1] for n in lengths)


# ---- the three training steps, built as the pipeline builds them ------------------------------------
@dataclass
class Setup:
    """What `train()` gets for one benchmark, plus the FLOPs of a micro-batch."""

    model: nn.Module
    task: Any
    dataset: Any
    run: dict[str, Any]  # TrainConfig fields from config.yaml (out_dir and cadence are set later)
    batch_flops: Callable[[Any], float]
    describe: str
    loop_kwargs: dict[str, Any] = field(default_factory=dict)
    # (model, trained) pairs whose nn.Linear products the step runs (trained: forward + both backward GEMMs)
    gemm_parts: list[tuple[nn.Module, bool]] = field(default_factory=list)


def build_teacher(C: dict, seed: int) -> nn.Module:
    """The dense teacher as workflow_scripts/pretrain_teacher.py builds it (special-token ids aside)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=C["data"]["tokenizer_vocab_size"], max_position_embeddings=C["data"]["seq_len"],
                         tie_word_embeddings=True, **C["models"]["teacher"])
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def random_rows(C: dict, n_rows: int, seed: int) -> torch.Tensor:
    """Packed-mixture-shaped rows `[n_rows, seq_len]` of uniform random token ids."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(C["data"]["tokenizer_vocab_size"], (n_rows, C["data"]["seq_len"]), generator=gen)


def setup_teacher(C: dict) -> Setup:
    from hybridlab.train.tasks import CausalLMTask

    model = build_teacher(C, C["seed"])
    run = {k: v for k, v in C["train"]["teacher"].items() if k != "eval_rows_per_language"}
    run["log_every"] = 10  # as pretrain_teacher.py
    counter = FlopCounter.of(model)
    rows = random_rows(C, 4 * run["micro_batch_size"], C["seed"])
    return Setup(model, CausalLMTask(), rows, run, lambda b: counter.train([b.shape[1]] * b.shape[0]),
                 f"dense Qwen3, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters",
                 gemm_parts=[(model, True)])


def setup_student(C: dict) -> Setup:
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.placements import fa_layers
    from hybridlab.train import distill

    teacher = build_teacher(C, C["seed"])
    n_layers = teacher.config.num_hidden_layers
    fa = fa_layers(STUDENT_PLACEMENT, n_layers, ratio=C["experiments"]["distill"]["fa_ratio"])
    student = convert_to_hybrid(teacher, fa, STUDENT_MIXER, seed=C["seed"])
    for p in student.parameters():  # stage 2 trains the whole student (workflow_scripts/distill.py)
        p.requires_grad_(True)
    d = C["train"]["distill"]
    task = distill.Stage2Task(teacher, chunk_tokens=d["kl_chunk_tokens"], vocab_chunk=d["kl_vocab_chunk"])
    run = {**d["stage2"], "seq_len": C["data"]["seq_len"]}
    s_count, t_count = FlopCounter.of(student), FlopCounter.of(teacher)

    def batch_flops(b: torch.Tensor) -> float:
        lengths = [b.shape[1]] * b.shape[0]
        return s_count.train(lengths) + t_count.forward(lengths)

    rows = random_rows(C, 4 * run["micro_batch_size"], C["seed"])
    return Setup(student, task, rows, run, batch_flops,
                 f"{STUDENT_PLACEMENT}-{STUDENT_MIXER}, FA layers {fa}, stage 2 with the frozen teacher",
                 {"grad_norm_groups": distill.grad_norm_groups()}, gemm_parts=[(student, True), (teacher, False)])


def setup_spaced_retrieval(C: dict) -> Setup:
    from hybridlab.data import spaced_retrieval as sr
    from hybridlab.train import spaced_retrieval as srt
    from hybridlab.train.bld import grad_norm_groups

    data_cfg = sr.SpacedRetrievalConfig(**{**C["data"]["spaced_retrieval"], "seed": C["seed"]})
    records = sr.generate_split(data_cfg, "train")
    shape = dict(C["train"]["bld_sr"]["model"])
    chunk = shape.pop("mixer_chunk_size", None)
    e = C["experiments"]["bld_sr"]
    model_cfg = srt.SRModelConfig(**shape, pattern=tuple(e["pattern"]), mixer=e["mixer"],
                                  max_position_embeddings=sr.sequence_length(data_cfg.t, max(data_cfg.gaps)),
                                  mixer_overrides={"chunk_size": chunk} if chunk else {})
    model = srt.build_sr_model(model_cfg, C["seed"])
    run = {k: v for k, v in C["train"]["bld_sr"].items() if k not in ("model", "eval_rows_per_gap")}
    counter = FlopCounter.of(model)
    return Setup(model, srt.SpacedRetrievalTask(data_cfg.gaps), sr.SpacedRetrievalDataset(records), run,
                 lambda b: counter.train(b["length"].tolist()),
                 f"{'/'.join(model.hybridlab_spec.layer_types)}, gaps {list(data_cfg.gaps)}",
                 {"collate_fn": sr.collate, "grad_norm_groups": grad_norm_groups(model)})


def build_smollm2(seed: int) -> nn.Module:
    """A randomly initialised model of SmolLM2-135M's shape (a step's cost does not depend on the weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**SMOLLM2))


def smollm2_rows(seed: int, n_rows: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(SMOLLM2["vocab_size"], (n_rows, SMOLLM2_ROWS[1]), generator=gen)


def setup_smollm2_stage2(C: dict) -> Setup:
    """Distillation stage 2 of the real preset's shape: the reverse-periodic GDN student of a SmolLM2-shaped
    teacher, 4 x 512-token micro-batches, the real preset's KL chunking, in fp32 (the reference's precision)."""
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.placements import fa_layers
    from hybridlab.train import distill

    teacher = build_smollm2(C["seed"])
    fa = fa_layers("reverse_periodic", SMOLLM2["num_hidden_layers"], ratio=C["experiments"]["distill"]["fa_ratio"])
    student = convert_to_hybrid(teacher, fa, "gdn", seed=C["seed"])
    for p in student.parameters():
        p.requires_grad_(True)
    task = distill.Stage2Task(teacher, chunk_tokens=1024)
    run = {"steps": 100, "micro_batch_size": SMOLLM2_ROWS[0], "lr": 1e-4, "warmup_steps": 0, "precision": "fp32",
           "seq_len": SMOLLM2_ROWS[1]}
    s_count, t_count = FlopCounter.of(student), FlopCounter.of(teacher)

    def batch_flops(b: torch.Tensor) -> float:
        lengths = [b.shape[1]] * b.shape[0]
        return s_count.train(lengths) + t_count.forward(lengths)

    return Setup(student, task, smollm2_rows(C["seed"], 4 * SMOLLM2_ROWS[0]), run, batch_flops,
                 f"SmolLM2-135M shape, reverse_periodic-gdn, FA layers {fa}, stage 2 with the frozen teacher",
                 {"grad_norm_groups": distill.grad_norm_groups()}, gemm_parts=[(student, True), (teacher, False)])


def run_forward(C: dict, steps: int, warmup: int) -> dict[str, float]:
    """The SmolLM2-shaped teacher's forward (logits included) on 4 x 512 tokens, as the distillation and
    analysis jobs run it; medians over `steps` timed passes after `warmup`."""
    model = build_smollm2(C["seed"]).eval()
    x = smollm2_rows(C["seed"], SMOLLM2_ROWS[0])
    gflop = FlopCounter.of(model).forward([x.shape[1]] * x.shape[0]) / 1e9
    dt = []
    with torch.no_grad():
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            model(input_ids=x, use_cache=False)
            if i >= warmup:
                dt.append(time.perf_counter() - t0)
    step = statistics.median(dt)
    return {"step_s": step, "step_s_min": min(dt), "tokens_per_step": x.numel(), "gflop_per_step": gflop,
            "tokens_per_s": x.numel() / step, "gflops": gflop / step}


SETUPS = {"teacher": setup_teacher, "student": setup_student, "spaced_retrieval": setup_spaced_retrieval,
          "smollm2_stage2": setup_smollm2_stage2}


# ---- timing inside the real loop --------------------------------------------------------------------
class _Enough(Exception):
    """Raised by the probe to end the run once the timed updates are done."""


class Probe:
    """Wraps a task (counting tokens and FLOPs per update) and times updates from the loop's step hook."""

    def __init__(self, task: Any, batch_flops: Callable[[Any], float], updates: int):
        self.task, self.batch_flops, self.updates = task, batch_flops, updates
        self.starts: list[float] = []
        self.tokens: list[int] = []
        self.flops: list[float] = []

    def on_step_start(self, step: int, model: nn.Module, optimizer: Any) -> None:
        self.starts.append(time.perf_counter())
        if len(self.starts) > self.updates:  # the start of update `updates` ends the last timed one
            raise _Enough
        self.tokens.append(0)
        self.flops.append(0.0)

    def loss(self, model: nn.Module, batch: Any):
        return self.task.loss(model, batch)

    def num_tokens(self, batch: Any) -> int:
        n = self.task.num_tokens(batch)
        self.tokens[-1] += n
        self.flops[-1] += self.batch_flops(batch)
        return n


def run_benchmark(setup: Setup, steps: int, warmup: int) -> dict[str, float]:
    """Time `steps` updates after `warmup` ones; medians of update time, tokens/s and GFLOP/s."""
    updates = warmup + steps
    probe = Probe(setup.task, setup.batch_flops, updates)
    with tempfile.TemporaryDirectory(prefix="train_throughput_") as out_dir:
        # At least one more update than timed, so the last timed one is never the run's final update
        # (which would write the final checkpoint); the preset's lr schedule is otherwise unchanged.
        cfg = TrainConfig.from_dict({**setup.run, "steps": max(setup.run["steps"], updates + 1), "out_dir": out_dir,
                                     "eval_every": None, "ckpt_every": None, "progress": False})
        try:
            train(setup.model, probe, setup.dataset, cfg, on_step_start=probe.on_step_start, **setup.loop_kwargs)
        except _Enough:
            pass
    dt = [b - a for a, b in zip(probe.starts[warmup:updates], probe.starts[warmup + 1:updates + 1])]
    tokens, flops = probe.tokens[warmup:updates], probe.flops[warmup:updates]
    return {
        "step_s": statistics.median(dt),
        "step_s_min": min(dt),
        "tokens_per_step": statistics.median(tokens),
        "gflop_per_step": statistics.median(flops) / 1e9,
        "tokens_per_s": statistics.median(n / t for n, t in zip(tokens, dt)),
        "gflops": statistics.median(f / t for f, t in zip(flops, dt)) / 1e9,
    }


def linear_gemm_time(parts: Sequence[tuple[nn.Module, bool]], tokens: int, reps: int = 5,
                     clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(seconds, GFLOP/s) of one micro-batch's `nn.Linear` products run alone, each at its own shape with
    `tokens` rows.

    Per Linear (in K, out N): the forward `linear(x[tokens, K], W[N, K])` and, where the model is trained,
    the backward's `dY @ W` and `dY^T @ X`; each timed on its own (best of `reps`) and weighted by how
    many Linears have that shape. This is what the CPU's GEMMs give at the model's sizes (K = 128 or 384
    at tiny), against the square 1024/2048 GEMMs of the MFU reference: a machine whose small-K GEMMs are
    far slower than its big ones cannot reach a high MFU whatever the rest of the step costs.
    """
    shapes: dict[tuple[int, int, bool], int] = {}
    for model, trained in parts:
        for m in model.modules():
            if isinstance(m, nn.Linear):
                key = (m.in_features, m.out_features, trained)
                shapes[key] = shapes.get(key, 0) + 1
    flops = seconds = 0.0
    for (k, n, trained), count in shapes.items():
        x, w, gy = torch.randn(tokens, k), torch.randn(n, k), torch.randn(tokens, n)
        products = [lambda x=x, w=w: torch.nn.functional.linear(x, w)]
        if trained:
            products += [lambda gy=gy, w=w: gy @ w, lambda gy=gy, x=x: gy.t() @ x]
        for product in products:
            flops += count * 2 * tokens * k * n
            seconds += count * best_seconds(product, reps, clock)
    return seconds, flops / seconds / 1e9


# ---- command line ------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int_at_least(1), default=5, help="timed updates per benchmark (median reported)")
    ap.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed updates before the timed ones")
    ap.add_argument("--threads", type=int_at_least(1), default=2, help="torch CPU threads")
    ap.add_argument("--scale", default="tiny", help="config.yaml preset the models and runs come from")
    ap.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(DEFAULT),
                    help="benchmarks to run (default: the tiny preset's three; smollm2_forward and smollm2_stage2 "
                    "are the real preset's shapes)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    C = resolve(load(ROOT / "config.yaml", {"scale": args.scale}))
    machine = describe()
    print(describe_line(machine))
    matmul = measure_matmul_gflops()
    print(f"{args.scale} preset, fp32, torch threads {torch.get_num_threads()}, {args.warmup} warm-up + "
          f"{args.steps} timed updates per benchmark")
    results = {}
    for name in args.only:
        if name == "smollm2_forward":
            print(f"  {name}: SmolLM2-135M shape, forward with logits, {SMOLLM2_ROWS[0]} x {SMOLLM2_ROWS[1]} tokens")
            results[name] = run_forward(C, args.steps, args.warmup)
            continue
        setup = SETUPS[name](C)
        print(f"  {name}: {setup.describe}")
        results[name] = run_benchmark(setup, args.steps, args.warmup)
        if setup.gemm_parts:
            tokens = setup.run["micro_batch_size"] * setup.run.get("seq_len", C["data"]["seq_len"])
            seconds, gflops = linear_gemm_time(setup.gemm_parts, tokens)
            results[name]["linear_gemm_gflops"] = gflops
            results[name]["linear_gemm_s"] = seconds * setup.run.get("grad_accum", 1)
        del setup
    after = measure_matmul_gflops()
    matmul_by_size = {n: max(matmul[n], after[n]) for n in matmul}
    peak = max(matmul_by_size.values())
    print("fp32 matmul throughput: " + ", ".join(f"{n}^3 {g:.1f}" for n, g in matmul_by_size.items())
          + f" GFLOP/s (reference {peak:.1f})\n")
    print(f"{'benchmark':18s} {'tokens/step':>11s} {'step s':>8s} {'tokens/s':>9s} {'GFLOP/step':>10s} "
          f"{'GFLOP/s':>8s} {'MFU':>6s} {'target':>7s}  met?")
    met = {}
    for name, r in results.items():
        r["mfu"] = r["gflops"] / peak
        target = TARGETS.get(name)
        if target is not None:
            r["target_mfu"] = target
            met[f"{name}_mfu>={target:g}"] = r["mfu"] >= target
        print(f"{name:18s} {r['tokens_per_step']:11.0f} {r['step_s']:8.3f} {r['tokens_per_s']:9.0f} "
              f"{r['gflop_per_step']:10.2f} {r['gflops']:8.1f} {100 * r['mfu']:5.1f}% "
              + (f"{100 * target:6.0f}%  {'yes' if r['mfu'] >= target else 'NO'}" if target is not None else
                 f"{'-':>7s}  -"))
    for name, r in results.items():
        if "linear_gemm_gflops" not in r:
            continue
        r["linear_gemm_share"] = r["linear_gemm_gflops"] / peak
        rest = r["step_s"] - r["linear_gemm_s"]
        line = (f"  {name}: its Linear GEMMs, run alone at the step's own shapes, reach {r['linear_gemm_gflops']:.1f} "
                f"GFLOP/s = {100 * r['linear_gemm_share']:.0f}% of the reference and would take "
                f"{r['linear_gemm_s']:.3f} s of the {r['step_s']:.3f} s update at that rate; the other "
                f"{max(rest, 0.0):.3f} s is attention, mixers, element-wise work, the optimiser and overhead")
        target = TARGETS.get(name)
        if target is not None and r["mfu"] < target:
            needed = r["gflop_per_step"] / (target * peak)  # the update time that meets the target
            line += f". Target {100 * target:.0f}% missed: it needs an update of {needed:.3f} s"
            if needed <= r["linear_gemm_s"]:
                line += ", less than its Linear GEMMs alone take at this CPU's rate for their shapes: unreachable"
            elif rest > 0:
                line += (f", i.e. the other part's time cut by {100 * (1 - (needed - r['linear_gemm_s']) / rest):.0f}%"
                         " (where that time goes: benchmarks/profile_ops.py)")
        print(line)
    report = {"scale": args.scale, "threads": torch.get_num_threads(), "steps": args.steps, "warmup": args.warmup,
              "matmul_gflops": peak, "matmul_gflops_by_size": {str(n): g for n, g in matmul_by_size.items()},
              "benchmarks": results, "targets_met": met, "machine": machine}
    print(json.dumps(report, sort_keys=True))
    return report


if __name__ == "__main__":
    try:
        main()
    except HybridlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
