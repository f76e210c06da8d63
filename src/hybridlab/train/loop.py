"""The one training loop shared by every trainer (pre-training, distillation, BLD).

`train(model, task, dataset, cfg, ...)` is model-agnostic: any `nn.Module`, a *task* object that
turns a batch into a loss, and a map-style dataset (`len` + integer indexing). One update:

1. `on_step_start(step, model, optimizer)` hooks (freeze schedules) after a due optimiser switch;
2. lr = schedule(step); draw the global batch (`cfg.batch_size` indices) from the seeded sampler;
3. for this rank's micro-batches: collate, move to the device, `task.loss(model, batch)` under the
   precision's autocast, backward of the loss times `engine.loss_scale` (FSDP2 reduce-scatters and
   averages over ranks, so gradients are the global-batch mean);
4. all-reduce loss/scalar sums over ranks; pre-clip gradient norm over all shards (total and per
   `grad_norm_groups`); stop with `HybridlabError` naming the step on a NaN/Inf loss or gradient,
   before any weight changes; clip; optimiser step;
5. every `log_every` steps (and at eval steps and the last step) a row in `metrics.parquet`; eval
   every `eval_every` steps; a checkpoint every `ckpt_every` steps and at the end (the end's holds only
   the weights with `final_checkpoint="weights"`: a rerun then only publishes).

Loss convention: each micro-batch loss is whatever the task returns (typically a token mean) and
the update's loss is the mean over the global batch's micro-batches. Step numbering: see
`hybridlab.train.config`. The run resumes from the latest checkpoint in `<out_dir>/checkpoints`
whenever one exists, so rerunning the same command after a kill continues the run; on CPU the
result is bitwise identical to an uninterrupted run (`restart=True` deletes previous outputs). A
checkpoint (sharded, `hybridlab.train.checkpoint`) resumes at any process count.

Distribution (`hybridlab.train.fsdp.Engine`): under torchrun (or with `fsdp="always"` in one
process) the model is sharded with FSDP2 and every task, hook and evaluation call receives the
sharded module, called through the FSDP root. Only rank 0's model needs real weights (the other
ranks may pass a skeleton built under `fsdp.params_on_meta`); when `train` returns, rank 0's model
holds the trained weights, full, on its device, and the other ranks' parameters are on `meta`. Only
rank 0 writes metrics and shows the progress bar; every rank writes its checkpoint shards. `eval_fn`
runs on every rank under `torch.no_grad()` (and the training precision's autocast) with the model in eval mode and the RNG states restored
afterwards, so evaluating never changes the training trajectory; rank 0's values are logged as
`eval/<key>`. `initial_eval(values)` (rank 0) receives `eval_fn`'s values for the weights `train` was
given, evaluated the same way before any checkpoint is loaded (the curve's 0-token point).

Preemption: SIGTERM (SLURM's time limit, a preemption, `kill`) does not kill the run mid-update. The
handler only records the request; after the update in progress, every rank learns of it (one all-reduce
of a flag per update), a checkpoint of that update is written and `train` raises `Preempted`, a one-line
`HybridlabError` that names the checkpoint, so the job exits with code 1 and the same command resumes
there. The handler is installed for the run's duration in the main thread and the previous one restored.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import default_collate
from tqdm.auto import tqdm

from hybridlab.errors import HybridlabError
from hybridlab.train.checkpoint import (
    capture_rng,
    latest_checkpoint,
    load_checkpoint,
    read_state,
    remove_run_outputs,
    restore_rng,
    save_checkpoint,
)
from hybridlab.train.config import TrainConfig
from hybridlab.train.distributed import DistContext, init_distributed
from hybridlab.train.fsdp import Engine
from hybridlab.train.metrics import MetricsLog
from hybridlab.train.optim import HybridOptimizer
from hybridlab.train.sampler import EpochSampler
from hybridlab.train.schedule import lr_factor

METRICS_FILE = "metrics.parquet"
CKPT_SUBDIR = "checkpoints"

StepHook = Callable[[int, nn.Module, HybridOptimizer], None]


class Task(Protocol):
    """What a trainer plugs into the loop.

    Optional: `shard_units(model) -> list[nn.Module]`, sub-modules the task calls directly (not through
    their parent decoder layer) and that must therefore be FSDP units of their own.
    """

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """Scalar loss to minimise and extra scalars to log (same keys every call)."""

    def num_tokens(self, batch: Any) -> int:
        """Tokens this batch trains on (for tokens/s and the token count)."""


@dataclass
class TrainResult:
    step: int
    tokens: int
    out_dir: Path
    checkpoint: Path | None
    metrics_path: Path


def train(
    model: nn.Module,
    task: Task,
    dataset: Any,
    cfg: TrainConfig,
    *,
    collate_fn: Callable[[list[Any]], Any] = default_collate,
    on_step_start: StepHook | Sequence[StepHook] | None = None,
    eval_fn: Callable[[nn.Module, int], dict[str, Any]] | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    grad_norm_groups: dict[str, Callable[[str], bool]] | None = None,
    restart: bool = False,
    fingerprint: str | None = None,
    initial_eval: Callable[[dict[str, float]], None] | None = None,
) -> TrainResult:
    """Train `model` on `task` until `cfg.total_steps()`, resuming from the latest checkpoint.

    `fingerprint` (e.g. a hash of the input files) is stored with every checkpoint; a checkpoint
    with another fingerprint is refused instead of resumed.
    """
    for name in ("loss", "num_tokens"):
        if not callable(getattr(task, name, None)):
            raise HybridlabError(f"task {type(task).__name__} has no {name}() method; see hybridlab.train.loop.Task")
    if initial_eval is not None and eval_fn is None:
        raise HybridlabError("initial_eval needs an eval_fn to evaluate with")
    ctx = init_distributed(cfg.device, cfg.fsdp)
    try:
        hooks = [] if on_step_start is None else [on_step_start] if callable(on_step_start) else list(on_step_start)
        run = _Run(model, task, dataset, cfg, ctx, collate_fn, hooks, eval_fn, on_checkpoint, grad_norm_groups or {},
                   fingerprint)
        run.initial_eval = initial_eval
        return run.run(restart)
    finally:
        ctx.close()


class _Run:
    def __init__(self, model, task, dataset, cfg, ctx: DistContext, collate_fn, hooks, eval_fn, on_checkpoint, groups,
                 fingerprint):
        self.caller, self.task, self.dataset, self.cfg, self.ctx = model, task, dataset, cfg, ctx
        self.collate_fn, self.hooks, self.eval_fn, self.on_checkpoint, self.groups = (
            collate_fn, hooks, eval_fn, on_checkpoint, groups
        )
        self.fingerprint = fingerprint
        self.out = Path(cfg.out_dir)
        self.ckpt_dir = self.out / CKPT_SUBDIR
        self.total = cfg.total_steps()
        if cfg.grad_accum % ctx.world_size:
            raise HybridlabError(
                f"grad_accum={cfg.grad_accum} is not divisible by the {ctx.world_size} processes; set grad_accum "
                "to a multiple of the process count (global batch = micro_batch_size x grad_accum)"
            )
        self.precision = cfg.resolved_precision(ctx.device.type)
        self.metrics = MetricsLog(self.out / METRICS_FILE, active=ctx.is_main)
        self.sampler = EpochSampler(len(dataset), cfg.seed)
        self.last_ckpt: Path | None = None
        self.initial_eval: Callable[[dict[str, float]], None] | None = None

    # ---- setup -------------------------------------------------------------------------------
    def _start(self, restart: bool) -> tuple[int, int]:
        cfg, ctx = self.cfg, self.ctx
        if restart and ctx.is_main:
            remove_run_outputs(self.out, CKPT_SUBDIR, (METRICS_FILE,))
        ctx.barrier()
        path = latest_checkpoint(self.ckpt_dir)
        state = read_state(path, cfg.config_hash(), self.fingerprint) if path is not None else None
        self.engine = Engine(self.caller, ctx, bf16_params=self.precision == "bf16",
                             activation_checkpointing=cfg.activation_checkpointing,
                             extra_units=getattr(self.task, "shard_units", None))
        self.model = self.engine.model
        self.model.train()
        want = self.initial_eval is not None
        if ctx.enabled:  # rank 0 decides, so every rank takes part in the (collective) evaluation
            want = ctx.all_gather_object(want)[0]
        if want:
            values = self._evaluate(0)
            if ctx.is_main and self.initial_eval is not None:
                self.initial_eval(values)
        kind = state["optimizer"] if state is not None else cfg.optimizer
        self.opt = HybridOptimizer(self.model, cfg, kind)
        if state is None:
            _seed_everything(cfg.seed + ctx.rank)
            self.metrics.resume(upto_step=0)
            return 0, 0
        if state.get("weights_only") and state["step"] < self.total:
            raise HybridlabError(f"checkpoint {path} holds only the weights (final_checkpoint: weights) at update "
                                 f"{state['step']} of {self.total}, so training cannot continue from it; rerun with "
                                 "--restart")
        load_checkpoint(path, self.model, self.opt.optimizers, state)
        if ctx.is_main:
            print(f"resuming from {path} at update {state['step']} of {cfg.total_steps()}", flush=True)
        try:
            self.sampler.load_state_dict(state["sampler"])
        except (ValueError, KeyError) as e:
            raise HybridlabError(
                f"checkpoint {path} does not fit this run ({' '.join(str(e).split())[:200]}); "
                "delete it or rerun with --restart"
            ) from e
        rngs = state["rng"]
        restore_rng(rngs[ctx.rank] if ctx.rank < len(rngs) else rngs[0])
        self.metrics.resume(upto_step=state["step"])
        self.last_ckpt = path
        return state["step"], state["tokens"]

    # ---- one update --------------------------------------------------------------------------
    def _update(self, step: int, want_groups: bool) -> dict[str, Any]:
        cfg, ctx, model, engine = self.cfg, self.ctx, self.model, self.engine
        kind = cfg.optimizer_for_update(step)
        if kind != self.opt.kind:
            self.opt = self.opt.switch_to(model, cfg, kind)
        for hook in self.hooks:
            hook(step, model, self.opt)
        factor = lr_factor(step, self.total, cfg.warmup_steps, cfg.schedule, cfg.min_lr_ratio)
        self.opt.set_lr(factor)
        self.opt.zero_grad()

        indices = self.sampler.next_indices(cfg.batch_size)
        mbs = cfg.micro_batch_size
        scale = engine.loss_scale(cfg.grad_accum)
        keys: list[str] | None = None
        sums: torch.Tensor | None = None
        for j in range(ctx.rank, cfg.grad_accum, ctx.world_size):
            batch = _to_device(self.collate_fn([self.dataset[i] for i in indices[j * mbs : (j + 1) * mbs]]), ctx.device)
            with self._autocast():
                loss, scalars = engine.run(self.task.loss, batch)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise HybridlabError(f"task.loss must return a scalar tensor first, got {type(loss).__name__}")
            if keys is None:
                keys = sorted(scalars)
            elif sorted(scalars) != keys:
                raise HybridlabError(f"task.loss returned scalars {sorted(scalars)} after {keys}; return the same keys")
            (loss * scale).backward()
            vals = [loss.detach().double(), float(self.task.num_tokens(batch))] + [_as_float(scalars[k]) for k in keys]
            row = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=ctx.device).reshape(()) for v in vals])
            sums = row if sums is None else sums + row
        assert sums is not None and keys is not None  # grad_accum >= world_size
        ctx.all_reduce_sum_(sums)
        engine.fill_missing_grads()
        params = list(model.parameters())

        stats = (sums / cfg.grad_accum).tolist()
        loss_mean, n_tokens = stats[0], int(round(sums[1].item()))
        norm = engine.grad_norm(params)
        bad = "loss" if not math.isfinite(loss_mean) else "gradient norm" if not torch.isfinite(norm) else None
        if bad:
            where = self.last_ckpt if self.last_ckpt is not None else "none (no checkpoint written yet)"
            raise HybridlabError(
                f"non-finite {bad} at step {step + 1} (loss={loss_mean}); training stopped before updating the "
                f"weights, last good checkpoint: {where}; lower the lr or check the data, then rerun to resume"
            )
        out = {"loss": loss_mean, "lr": cfg.lr * factor, "grad_norm": float(norm), "n_tokens": n_tokens}
        out.update({k: v for k, v in zip(keys, stats[2:])})
        if want_groups:
            named = list(model.named_parameters())
            out.update({f"grad_norm/{g}": float(engine.grad_norm(p for n, p in named if pred(n)))
                        for g, pred in self.groups.items()})
        if cfg.grad_clip is not None:
            engine.clip_(params, cfg.grad_clip, norm)
        self.opt.step()
        return out

    def _autocast(self):
        if self.precision == "bf16":
            return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ---- eval / checkpoint ---------------------------------------------------------------------
    def _evaluate(self, step: int) -> dict[str, float]:
        """eval_fn's values (as floats) through the engine, in eval mode, with the RNG states restored."""
        rng = capture_rng()
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():  # evaluated in the precision it trains in
                result = self.engine.run(self.eval_fn, step)
        finally:
            self.model.train()
            restore_rng(rng)
        if not isinstance(result, dict):
            raise HybridlabError(f"eval_fn must return a dict of scalars, got {type(result).__name__}")
        return {k: _as_float(v) for k, v in result.items()}

    def _checkpoint(self, step: int, tokens: int, weights_only: bool = False) -> None:
        ok, bad = self.engine.all_finite()  # the same verdict on every rank, so no rank waits forever
        if not ok:
            raise HybridlabError(
                f"refusing to write checkpoint at step {step}: parameter {bad or '(on another rank)'} has NaN/Inf "
                "values; lower the lr or check the data, then rerun to resume from the last good checkpoint"
            )
        rngs = self.ctx.all_gather_object(capture_rng())
        state = {
            "tokens": tokens,
            "config_hash": self.cfg.config_hash(),
            "fingerprint": self.fingerprint,
            "world_size": self.ctx.world_size,
            "optimizer": self.opt.kind,
            "sampler": self.sampler.state_dict(),
            "rng": rngs,
            "weights_only": weights_only,
        }
        optimizers = {} if weights_only else self.opt.optimizers
        self.last_ckpt = save_checkpoint(self.ckpt_dir, step, self.model, optimizers, state,
                                         self.cfg.keep_last_k, is_main=self.ctx.is_main, barrier=self.ctx.barrier)
        if self.on_checkpoint is not None and self.ctx.is_main:
            self.on_checkpoint(step)
        self.ctx.barrier()

    # ---- driver --------------------------------------------------------------------------------
    def run(self, restart: bool) -> TrainResult:
        with _sigterm_requests() as stop:
            return self._run(restart, stop)

    def _stop_requested(self, stop: list[int]) -> bool:
        """Whether any rank got SIGTERM (the same answer on every rank, so all stop at the same update)."""
        if not self.ctx.enabled:
            return bool(stop)
        flag = torch.tensor([float(bool(stop))], dtype=torch.float64, device=self.ctx.device)
        self.ctx.all_reduce_sum_(flag)
        return bool(flag.item() > 0)

    def _run(self, restart: bool, stop: list[int]) -> TrainResult:
        cfg = self.cfg
        step, tokens = self._start(restart)
        bar = tqdm(total=self.total, initial=step, desc="train", unit="step",
                   disable=not (self.ctx.is_main and cfg.progress), dynamic_ncols=True)
        t_last, tok_last = time.perf_counter(), tokens
        try:
            while step < self.total:
                done = step + 1
                is_last = done == self.total
                do_eval = self.eval_fn is not None and cfg.eval_every is not None and (done % cfg.eval_every == 0 or is_last)
                do_log = do_eval or is_last or done % cfg.log_every == 0
                out = self._update(step, want_groups=do_log)
                step, tokens = done, tokens + out.pop("n_tokens")
                now = time.perf_counter()
                tps = (tokens - tok_last) / max(now - t_last, 1e-9)
                bar.update(1)
                bar.set_postfix(loss=f"{out['loss']:.4f}", tok_s=f"{tps:.0f}")
                if do_log:
                    row = {"step": step, "tokens": tokens, "loss": out.pop("loss"), "lr": out.pop("lr"),
                           "grad_norm": out.pop("grad_norm"), "tokens_per_s": tps, **out}
                    if do_eval:
                        row.update({f"eval/{k}": v for k, v in self._evaluate(step).items()})
                    self.metrics.append(row)
                    self.metrics.flush()
                    t_last, tok_last = time.perf_counter(), tokens
                due = is_last or (cfg.ckpt_every is not None and step % cfg.ckpt_every == 0)
                preempted = not is_last and self._stop_requested(stop)
                if due or preempted:
                    self._checkpoint(step, tokens, weights_only=is_last and cfg.final_checkpoint == "weights")
                if preempted:
                    self.metrics.flush()
                    raise Preempted(f"stopped by SIGTERM after update {step} of {self.total}; checkpoint "
                                    f"{self.last_ckpt} written; rerun the same command to resume from it")
        except BaseException:
            if hasattr(self, "engine"):
                self.engine.abandon()
            raise
        finally:
            bar.close()
        # The optimiser state and every reference to the sharded model go before the weights are gathered.
        self.opt = self.model = None
        self.engine.finish()
        return TrainResult(step, tokens, self.out, latest_checkpoint(self.ckpt_dir), self.out / METRICS_FILE)


class Preempted(HybridlabError):
    """The run stopped on SIGTERM after writing a checkpoint of its last update."""


@contextlib.contextmanager
def _sigterm_requests():
    """A list that gains an entry when SIGTERM arrives while the block runs (main thread only; elsewhere, e.g.
    a test's worker thread, signals cannot be caught and the list stays empty)."""
    requests: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield requests
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: requests.append(signum))
    try:
        yield requests
    finally:
        signal.signal(signal.SIGTERM, previous)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _as_float(v: Any) -> float:
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise HybridlabError(f"logged scalars must be single numbers, got a tensor of shape {tuple(v.shape)}")
        return float(v.detach().double().item())
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise HybridlabError(f"logged scalars must be numbers or one-element tensors, got {type(v).__name__}")


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device) for v in obj)
    return obj
