"""The training engine: FSDP2 (`torch.distributed.fsdp.fully_shard`) under torchrun, plain on one process.

`Engine(model, ctx, ...)` prepares the module the loop trains and gives it back at the end:

- **One process** (a laptop, `WORLD_SIZE` unset, `fsdp="auto"`): the model itself is trained, on
  `ctx.device`.
- **Sharded** (torchrun with W processes, gloo on CPU and nccl on CUDA; or one process with
  `TrainConfig.fsdp="always"`, a group of one): a meta-device copy of the model (parameters
  on `meta`, buffers real) is sharded with `fully_shard`: first the task's extra units (for stage-1
  distillation the mixer wrappers, which it calls directly), then every decoder layer, then a root
  `_Root` module that holds the model and runs a function on it (`engine.run(fn, ...)`). Every loss,
  evaluation and hook call goes through that root, so parameters outside the decoder layers
  (embeddings, final norm, the LM head that chunked losses read directly) are gathered for the call
  and freed after it. The copy's shards are filled from rank 0's weights
  (`set_model_state_dict(..., broadcast_from_rank0=True)`): only rank 0's caller needs real weights
  (on the CPU is enough); the other ranks may pass a skeleton whose parameters are on `meta`
  (`params_on_meta`), so no rank ever holds the full model on its device. The caller's parameters
  are moved to `meta` for the run. `finish()` gathers the trained weights to rank 0's CPU one tensor
  at a time (after the caller has dropped the optimiser and the sharded copy is freed) and puts them
  back into rank 0's model on `ctx.device`; on the other ranks the caller's parameters stay on `meta`
  (they return without publishing).
- **Mixed precision** with bf16 (sharded, CPU and CUDA alike):
  `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`: fp32 master shards, bf16 gathered
  parameters for compute, gradients reduced in fp32 (`reduce_dtype`, on gloo as on nccl). A
  single unsharded process keeps fp32 parameters under the loop's bf16 autocast.
- **Fused RMSNorm on CPU**: the trained model's transformers RMSNorms take `models.fused`'s one-node
  forward/backward (bit-identical output, fewer element-wise passes); `finish()` restores their classes.
- **Activation checkpointing** (`activation_checkpointing=True`): each decoder layer's forward runs
  under non-reentrant `torch.utils.checkpoint`, inside the FSDP unit (recomputed in backward). Names
  of parameters do not change, so freeze patterns, optimiser groups and checkpoints are unaffected.
- **Gradients**: FSDP averages over ranks, so each rank divides its micro-batch losses by its own
  micro-batch count (`loss_scale`). A trainable parameter that no micro-batch of an update reaches gets
  a zero gradient (FSDP reduce-scatters zeros for it; the single process does the same in
  `fill_missing_grads`), as with DDP, so one and W processes update the same parameters.
- **A frozen model** (the distillation teacher) is either replicated (its own copy on every rank, bf16
  at paper) or sharded: `Frozen(model, ctx, shard=True)` applies `fully_shard` per decoder layer and
  to a root like the one above, and every use goes through `Frozen.run(fn, ...)` on every rank.
- `grad_norm` and `all_finite` reduce over the local shards of every rank, so every rank takes the same
  decision (clip factor, NaN stop) and no rank waits forever.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from hybridlab.errors import HybridlabError
from hybridlab.models.fused import fuse_rms_norms
from hybridlab.models.sites import decoder_layers_or_none
from hybridlab.train.distributed import DistContext


class _Root(nn.Module):
    """FSDP root: its forward runs `fn(model, *args)` with the root-level parameters gathered."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.model, *args)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


class Engine:
    def __init__(self, model: nn.Module, ctx: DistContext, *, bf16_params: bool = False,
                 activation_checkpointing: bool = False, extra_units: Callable[[nn.Module], Sequence[nn.Module]] | None = None):
        self.ctx, self.caller = ctx, model
        self.sharded = ctx.shards
        self._unfuse = lambda: None
        if not self.sharded:
            self.model = model.to(ctx.device)
            self._ckpt_layers = _enable_checkpointing(model) if activation_checkpointing else []
            if ctx.device.type == "cpu":
                self._unfuse = fuse_rms_norms(model)
            self._root = None
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # Rank 0's weights are broadcast shard by shard; the other ranks' (possibly meta) values are ignored.
        full_sd = {k: v.detach() for k, v in model.state_dict().items()} if ctx.is_main else {}
        if ctx.is_main and any(v.is_meta for v in full_sd.values()):
            raise HybridlabError("rank 0's model has parameters on the meta device; load its weights (only the "
                                 "other ranks may pass a skeleton); report this as a bug")
        work, self._slots = _meta_copy(model)
        self._ckpt_layers = _enable_checkpointing(work) if activation_checkpointing else []
        if ctx.device.type == "cpu":
            fuse_rms_norms(work)  # the sharded copy is dropped at finish(): nothing to undo
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16_params else MixedPrecisionPolicy())
        units = list(extra_units(work)) if extra_units is not None else []
        units += list(decoder_layers_or_none(work) or [])
        depth = {id(m): n.count(".") + 1 for n, m in work.named_modules()}
        for unit in sorted(units, key=lambda m: -depth[id(m)]):  # inner units first
            fully_shard(unit, mp_policy=mp)
        self._root = _Root(work)
        fully_shard(self._root, mp_policy=mp)
        self._root.set_reduce_scatter_unused_params(True)
        self._root.to_empty(device=ctx.device)
        # to_empty left the buffers uninitialised: copy them (non-persistent ones too) from the caller.
        with torch.no_grad():
            for (name, b_work), (_, b_src) in zip(_named_buffers(work), _named_buffers(model)):
                if b_src.is_meta:
                    raise HybridlabError(f"buffer {name} is on the meta device; build skeletons with "
                                         "hybridlab.train.fsdp.params_on_meta (real buffers)")
                b_work.copy_(b_src)
        set_model_state_dict(work, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        del full_sd
        # The caller's full weights are not needed until finish(): with no reference left (the slots hold the
        # meta stand-ins too) their memory is freed.
        self._slots = _park_on_meta(self._slots)
        self.model = work
        bad = [n for n, p in work.named_parameters() if p.requires_grad and not isinstance(p, DTensor)]
        if bad:
            raise HybridlabError(f"parameters {bad[:3]} are trainable but were not sharded; report this as a bug")

    # ---- calls -------------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(model, *args)`: through the FSDP root when sharded, so every parameter is gathered for it."""
        if self._root is None:
            return fn(self.model, *args)
        out = self._root(fn, *args)
        if not torch.is_grad_enabled():
            # FSDP keeps the root's parameters gathered after its forward for the backward that usually
            # follows; with none coming (evaluation) they must be resharded, or the module would expose
            # the gathered copies instead of the shards the optimiser and checkpoints hold.
            self._root.reshard()
        return out

    def loss_scale(self, grad_accum: int) -> float:
        """Factor for each micro-batch loss so the reduced gradient is the global-batch mean."""
        return self.ctx.world_size / grad_accum

    def fill_missing_grads(self) -> None:
        """Single process: a zero gradient for trainable parameters no micro-batch reached (FSDP does this)."""
        if self.sharded:
            return
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)

    def grad_norm(self, params: Iterable[torch.Tensor]) -> torch.Tensor:
        """Global L2 norm of the gradients of `params` (over all shards)."""
        grads = [local(p.grad) for p in params if p.grad is not None]
        if not self.sharded:
            return torch.nn.utils.get_total_norm(grads, norm_type=2.0) if grads else torch.zeros(())
        sq = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        for g in grads:
            sq += g.double().pow(2).sum()
        dist.all_reduce(sq, op=dist.ReduceOp.SUM)
        return sq.sqrt().float()

    def clip_(self, params: Iterable[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
        """Scale gradients by min(1, max_norm / (norm + 1e-6)), torch's clipping rule, shard by shard."""
        grads = [local(p.grad) for p in params if p.grad is not None]
        if grads:
            coef = torch.clamp(max_norm / (norm.to(grads[0].device) + 1e-6), max=1.0)
            torch._foreach_mul_(grads, coef)

    def all_finite(self) -> tuple[bool, str | None]:
        """Whether every weight is finite on every rank, and the first bad name on this rank."""
        bad = next((n for n, p in self.model.named_parameters() if not torch.isfinite(local(p)).all()), None)
        if not self.sharded:
            return bad is None, bad
        flag = torch.tensor([0 if bad is None else 1], device=self.ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() == 0), bad

    # ---- the end -----------------------------------------------------------------------------------
    def finish(self) -> None:
        """Give rank 0's model its trained weights on `ctx.device` and drop the sharded copy.

        Sharded: the full state is gathered one tensor at a time to rank 0's CPU (the other ranks get
        nothing), the sharded copy is freed, then rank 0's model gets its parameters back on the device.
        The caller drops its optimiser (and any other reference to `engine.model`) before calling this.
        """
        _disable_checkpointing(self._ckpt_layers)
        self._ckpt_layers = []  # they are the sharded copy's layers: no reference may outlive it
        self._unfuse()
        if not self.sharded:
            return
        from torch.distributed.checkpoint import state_dict as dcp_state_dict

        for p in self.model.parameters():  # the last update's gradients are not part of the gathered state
            p.grad = None
        full = dcp_state_dict.get_model_state_dict(self.model, options=dcp_state_dict.StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        self.model = self._root = None
        gc.collect()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        if self.ctx.is_main:
            _restore_from(self._slots, full, self.ctx.device)

    def abandon(self) -> None:
        """After an error: undo activation checkpointing and the fused norms; a sharded run leaves the caller's
        weights on meta."""
        _disable_checkpointing(self._ckpt_layers)
        self._unfuse()


class Frozen:
    """A model that is never trained, called as `run(fn, *args)`: replicated, or FSDP-sharded.

    Sharded, `fn(model, *args)` runs inside the FSDP root's forward under no_grad, so every parameter
    (including the head weight a chunked loss reads) is gathered for the call and freed after it:
    `fn` must not return parameters (return copies). Every rank must make the same calls.
    """

    def __init__(self, model: nn.Module, ctx: DistContext | None = None, *, shard: bool = False):
        """`ctx` None: the model as it is (replicated, left on its device)."""
        self.model = model if ctx is None else model.to(ctx.device)
        self.sharded = shard and ctx is not None and ctx.enabled
        self._root = None
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            for layer in decoder_layers_or_none(model) or []:
                fully_shard(layer)
            self._root = _Root(model)
            fully_shard(self._root)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._root is None:
            return fn(self.model, *args)
        with torch.no_grad():
            out = self._root(fn, *args)
        self._root.reshard()
        return out


# ---- helpers -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def params_on_meta():
    """Modules built inside get their parameters on `meta` (each made, then moved) and real buffers.

    For sharded ranks other than 0: the model's structure and buffers (rotary tables) without its weights,
    which the engine fills shard by shard from rank 0.
    """
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _named_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return list(model.named_buffers(remove_duplicate=True))


def _param_slots(model: nn.Module) -> list[tuple[nn.Module, str, str, nn.Parameter]]:
    """(module, attribute, first full name, parameter) for every parameter slot; tied slots share one."""
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=True):
        first[id(p)] = name
    slots = []
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for attr, p in list(mod._parameters.items()):
            if p is not None:
                slots.append((mod, attr, first[id(p)], p))
    return slots


def _meta_copy(model: nn.Module) -> tuple[nn.Module, list]:
    """A deep copy whose parameters live on `meta` (cheap), plus the caller's parameter slots."""
    slots = _param_slots(model)
    metas: dict[int, nn.Parameter] = {}
    for mod, attr, _, p in slots:
        if id(p) not in metas:
            metas[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
        mod._parameters[attr] = metas[id(p)]
    try:
        work = copy.deepcopy(model)
    finally:
        for mod, attr, _, p in slots:
            mod._parameters[attr] = p
    return work, slots


def _park_on_meta(slots) -> list:
    """Put meta stand-ins (same shape, dtype, requires_grad; ties kept) into the slots; the slots with them."""
    metas: dict[int, nn.Parameter] = {}
    out = []
    for mod, attr, name, p in slots:
        if id(p) not in metas:
            metas[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
        mod._parameters[attr] = metas[id(p)]
        out.append((mod, attr, name, metas[id(p)]))
    return out


def _restore_from(slots, full: dict[str, torch.Tensor], device: torch.device) -> None:
    """The gathered tensors (fresh CPU copies, popped so each is held once) as the slots' parameters."""
    new: dict[int, nn.Parameter] = {}
    for mod, attr, name, p in slots:
        if id(p) not in new:
            new[id(p)] = nn.Parameter(full.pop(name).detach().to(device=device, dtype=p.dtype),
                                      requires_grad=p.requires_grad)
        mod._parameters[attr] = new[id(p)]


def _enable_checkpointing(model: nn.Module) -> list[nn.Module]:
    layers = list(decoder_layers_or_none(model) or [])
    if not layers:
        raise HybridlabError(f"activation_checkpointing needs decoder layers, and {type(model).__name__} has none; "
                             "set activation_checkpointing: false")
    for layer in layers:
        layer.forward = functools.partial(_checkpointed, type(layer).forward.__get__(layer))
    return layers


def _checkpointed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _disable_checkpointing(layers: list[nn.Module]) -> None:
    for layer in layers:
        layer.__dict__.pop("forward", None)
