"""Parameter groups and the AdamW / Muon+AdamW optimiser used by the training loop.

Parameter classification (by name from `model.named_parameters()`, tied weights counted once):

- weight decay: none for parameters with ndim < 2 (biases, norm scales, 1-D gates such as `A_log`,
  `dt_bias`) and for names matching any `cfg.no_decay_patterns`; `cfg.weight_decay` for the rest.
- lr multiplier: `cfg.lr_multipliers` maps a regex (re.search on the name) to a multiplier, e.g.
  `{"self_attn": 2.0}` for a separate attention lr. A parameter matching two patterns is an error,
  and so is a pattern matching nothing (a typo would otherwise silently do nothing).
- optimiser family for `kind == "muon"`: `torch.optim.Muon` for 2-D weight matrices of hidden
  layers; AdamW for everything else: ndim != 2, weights owned by `nn.Embedding`, and names matching
  `cfg.muon_exclude_patterns` (embeddings and the LM head by default). Muon orthogonalises the
  update of a matrix, which is meaningful for linear maps between hidden spaces but not for lookup
  tables (embeddings), the vocabulary projection or vectors, as recommended by the Muon authors.
  For `kind == "adamw"` every parameter is in AdamW.

Muon's lr is `cfg.muon_lr` (default: `cfg.lr`) and by default uses `adjust_lr_fn="match_rms_adamw"`
(update RMS matched to AdamW's), so AdamW's lr and weight decay can be reused as is.

Under FSDP2 the parameters are DTensor shards. AdamW is element-wise and runs on them as they are.
Muon is not: Newton-Schulz orthogonalises a whole matrix, and on a shard it would orthogonalise a
slice. `ShardedMuon` (used for every Muon group, sharded or not) keeps the momentum on the shard,
gathers each matrix's full update, orthogonalises it on one owner rank (matrices are dealt round
robin over ranks) and scatters the result back as shards, so the update equals the unsharded one.
On plain tensors it is torch.optim.Muon's update exactly.

Frozen parameters (requires_grad False, so `.grad is None` after `zero_grad(set_to_none=True)`) are
skipped by both torch optimisers entirely: no update, no weight decay, no state change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.train.config import TrainConfig


@dataclass(frozen=True)
class ParamInfo:
    name: str
    param: nn.Parameter
    family: str  # "adamw" | "muon"
    decay: bool
    lr_mult: float


def classify_params(model: nn.Module, cfg: TrainConfig, kind: str) -> list[ParamInfo]:
    """Assign every parameter its optimiser family, weight decay and lr multiplier."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    no_decay = [re.compile(p) for p in cfg.no_decay_patterns]
    muon_excl = [re.compile(p) for p in cfg.muon_exclude_patterns]
    mults = [(pat, re.compile(pat), m) for pat, m in cfg.lr_multipliers.items()]
    used_patterns: set[str] = set()
    infos = []
    for name, p in model.named_parameters():
        hits = [(pat, m) for pat, rx, m in mults if rx.search(name)]
        if len(hits) > 1:
            raise HybridlabError(
                f"parameter {name!r} matches several lr_multipliers patterns {[h[0] for h in hits]}; "
                "make the patterns disjoint"
            )
        used_patterns.update(h[0] for h in hits)
        is_matrix = p.ndim == 2 and id(p) not in embedding_ids and not any(r.search(name) for r in muon_excl)
        infos.append(
            ParamInfo(
                name=name,
                param=p,
                family="muon" if kind == "muon" and is_matrix else "adamw",
                decay=p.ndim >= 2 and not any(r.search(name) for r in no_decay),
                lr_mult=hits[0][1] if hits else 1.0,
            )
        )
    if not infos:
        raise HybridlabError("the model has no parameters to train; pass the model to be trained")
    unused = sorted(set(cfg.lr_multipliers) - used_patterns)
    if unused:
        raise HybridlabError(f"lr_multipliers patterns {unused} match no parameter name; fix or remove them")
    return infos


def build_param_groups(model: nn.Module, cfg: TrainConfig, kind: str) -> dict[str, list[dict[str, Any]]]:
    """Per optimiser family, torch param-group dicts keyed by (decay, lr multiplier)."""
    groups: dict[str, dict[tuple[bool, float], dict[str, Any]]] = {"adamw": {}, "muon": {}}
    for info in classify_params(model, cfg, kind):
        peak = (cfg.muon_lr or cfg.lr) if info.family == "muon" else cfg.lr
        key = (info.decay, info.lr_mult)
        g = groups[info.family].setdefault(
            key,
            {
                "params": [],
                "param_names": [],
                "name": f"{info.family}/{'decay' if info.decay else 'no_decay'}/x{info.lr_mult:g}",
                "weight_decay": cfg.weight_decay if info.decay else 0.0,
                "base_lr": peak * info.lr_mult,
                "lr": peak * info.lr_mult,
            },
        )
        g["params"].append(info.param)
        g["param_names"].append(info.name)
    return {fam: list(d.values()) for fam, d in groups.items() if d}


class HybridOptimizer:
    """AdamW alone (`kind="adamw"`) or Muon for hidden matrices + AdamW for the rest (`kind="muon"`)."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, kind: str):
        if kind not in ("adamw", "muon"):
            raise HybridlabError(f"unknown optimizer {kind!r}; use adamw or muon")
        self.kind = kind
        groups = build_param_groups(model, cfg, kind)
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        if "adamw" in groups:
            self.optimizers["adamw"] = torch.optim.AdamW(
                groups["adamw"], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
            )
        if "muon" in groups:
            self.optimizers["muon"] = ShardedMuon(
                groups["muon"],
                lr=cfg.muon_lr or cfg.lr,
                weight_decay=cfg.weight_decay,
                momentum=cfg.muon_momentum,
                adjust_lr_fn=cfg.muon_adjust_lr,
            )

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def set_lr(self, factor: float) -> None:
        for g in self.param_groups:
            g["lr"] = g["base_lr"] * factor

    def zero_grad(self) -> None:
        # set_to_none is what makes frozen parameters invisible to the optimisers (grad stays None).
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def state_for(self, p: torch.Tensor) -> dict[str, Any]:
        """The optimiser state of one parameter (empty before its first update)."""
        for opt in self.optimizers.values():
            if p in opt.state:
                return opt.state[p]
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()}}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if sd["kind"] != self.kind or set(sd["optimizers"]) != set(self.optimizers):
            raise ValueError(
                f"optimizer state is for {sd['kind']} {sorted(sd['optimizers'])}, "
                f"this run builds {self.kind} {sorted(self.optimizers)}"
            )
        for k, o in self.optimizers.items():
            o.load_state_dict(sd["optimizers"][k])

    def switch_to(self, model: nn.Module, cfg: TrainConfig, kind: str) -> "HybridOptimizer":
        """A new optimiser of `kind`; parameters that stay in AdamW keep their AdamW state."""
        new = HybridOptimizer(model, cfg, kind)
        old_adamw = self.optimizers.get("adamw")
        new_adamw = new.optimizers.get("adamw")
        if old_adamw is not None and new_adamw is not None:
            for g in new_adamw.param_groups:
                for p in g["params"]:
                    if p in old_adamw.state:
                        new_adamw.state[p] = old_adamw.state[p]
        return new


class ShardedMuon(torch.optim.Muon):
    """torch.optim.Muon whose orthogonalisation sees full matrices when parameters are DTensor shards."""

    @torch.no_grad()
    def step(self, closure=None):
        from torch.distributed.tensor import DTensor, distribute_tensor
        from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        owner = 0
        for group in self.param_groups:
            lr, wd, mom = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.ndim != 2:
                    raise HybridlabError(f"Muon got a {p.grad.ndim}-D parameter; Muon takes 2-D matrices only")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                if not isinstance(p, DTensor):
                    buf.lerp_(p.grad, 1 - mom)
                    update = p.grad.lerp(buf, mom) if group["nesterov"] else buf
                    update = _zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                    p.mul_(1 - lr * wd)
                    p.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
                    continue
                g_loc, buf_loc, p_loc = p.grad.to_local(), buf.to_local(), p.to_local()
                buf_loc.lerp_(g_loc, 1 - mom)
                upd_loc = g_loc.lerp(buf_loc, mom) if group["nesterov"] else buf_loc
                upd = DTensor.from_local(upd_loc, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
                full = upd.full_tensor()  # every rank gathers; only the owner orthogonalises
                me = p.device_mesh.get_local_rank()
                if me == owner % p.device_mesh.size():
                    ortho = _zeropower_via_newtonschulz(full, group["ns_coefficients"], group["ns_steps"], group["eps"])
                else:
                    ortho = torch.empty(full.shape, dtype=torch.bfloat16, device=full.device)
                shard = distribute_tensor(ortho, p.device_mesh, p.placements,
                                          src_data_rank=owner % p.device_mesh.size()).to_local()
                owner += 1
                p_loc.mul_(1 - lr * wd)
                p_loc.add_(shard, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss
