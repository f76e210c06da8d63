"""Memory plan: estimated peak bytes per rank of every training and evaluation job of a preset, and its report.
Model shapes and parameter counts live in `hybridlab.pipeline.cluster.model_shapes`, the disk plan in
`hybridlab.pipeline.cluster.disk_plan`.

Public API (stable; benchmarks/gpu_acceptance.py calls the first two):

    estimate_step(config, *, micro_batch, seq_len, world_size=1, task="lm", mixer=None, mixer_layers=0,
                  mixer_overrides=None, teacher=None, precision="bf16", checkpointing=True,
                  optimizer="adamw", chunk_tokens=1024, vocab_chunk=None, logits="chunked",
                  teacher_sharded=None, overhead_bytes=None) -> Estimate
        One training step (forward + backward + optimizer step) of the model of `config` (a transformers
        config, a config.json dict, a local model directory, or a hub name in KNOWN_MODELS; no network).
        task: "lm" (next-token CE), "stage1" (distillation: mixers align to the teacher's attention
        outputs, only mixers train), "stage2" (logit KL to the teacher). mixer / mixer_layers: the hybrid
        student's mixer kind and how many layers are mixers (0 = dense). precision "bf16" = FSDP2 mixed
        precision on CUDA (fp32 sharded master weights, gradients and optimizer state, bf16 compute);
        "fp32" = plain fp32 (the CPU check). teacher: the teacher's config for stage 1/2 (default:
        `config`); teacher_sharded None = replicate if it fits, else shard.
    measure_peak_bytes(fn) -> (result, peak_bytes)
        Runs fn() and returns its result and the peak of live tensor-storage bytes allocated during it
        (above what was live before; a TorchDispatchMode that tracks output storages with weakref
        finalizers). Compare with CUDA's max_memory_allocated() - memory_allocated() at entry.
    estimate_forward(config, *, batch, seq_len, ...) / estimate_generate(config, *, batch, context, ...)
        Evaluation forwards (no grad) and greedy generation with KV cache / recurrent state.
    plan_preset(config_dict, *, gpu_mem_gb=80, gpus=None) -> list[JobPlan]
        Every job of the active preset with its estimate and verdict (fits at N GPUs, smallest N).

`Estimate.terms` are named byte counts (parameters, gradients, optimizer, teacher, activations,
logits, cache, cuda_context); `Estimate.total` is their sum.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hybridlab.errors import HybridlabError
from hybridlab.train.losses import KEPT_LOGITS_ELEMENTS
# KNOWN_MODELS and the parameter counts stay importable from here (hybridlab.pipeline.cluster.plan.<name>)
from hybridlab.pipeline.cluster.model_shapes import (  # noqa: F401
    KNOWN_MODELS,
    Shape,
    _n_fa,
    attention_params,
    dense_params,
    hidden_matrix_params,
    layer_params,
    mixer_params,
    model_params,
    root_params,
    shape_of,
)

GB = 1e9
GPU_COUNTS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
# Fixed per-GPU allowance for the CUDA context, NCCL buffers and allocator fragmentation (not estimated).
CUDA_CONTEXT_BYTES = int(3 * GB)
TASKS = ("lm", "stage1", "stage2")
PRECISIONS = ("bf16", "fp32")


# ---- activations ------------------------------------------------------------------------------------
def _block_elems(s: Shape) -> tuple[int, int]:
    """(compute-dtype, fp32) elements per token a decoder block saves outside its token mixer.

    Two RMSNorms (each keeps its fp32 upcast and normalised input, plus the weighted output) and the
    SwiGLU MLP (gate, up, silu(gate), product). Counted from transformers' modules and checked by
    tracing a CPU fp32 forward (see tests/train/test_plan.py).
    """
    return 2 * s.hidden_size + 4 * s.intermediate_size, 4 * s.hidden_size + 2


def _attention_elems(s: Shape) -> tuple[int, int]:
    """(compute, fp32) elements per token saved by a GQA attention (SDPA flash path: output + logsumexp).

    With per-head q/k norms (Qwen3) q and k are kept before and after the norm and after RoPE.
    """
    qk = s.q_dim + s.kv_dim
    if s.qk_norm:
        return 2 * qk, 2 * qk + 2 * s.num_heads + s.num_kv_heads
    return 2 * qk, s.num_heads


# fla-style mixers on CUDA, per token and head-dim channel of q (elements, compute / fp32): q/k/v
# conv input, conv output and SiLU output (9), op output and gate projection (3); fp32 gates and the
# gated RMSNorm's upcasts (5 for GDN; KDA adds per-channel decay and its softplus input, GLA its
# log-sigmoid gate). Per head: the chunk's intra-chunk matrix (chunk_size fp32) and small gates.
_MIXER_CUDA_PER_QDIM = {"gdn": (12, 5), "kda": (13, 9), "gla": (12, 8)}


def _mixer_elems_cuda(s: Shape, kind: str, chunk: int) -> tuple[int, int]:
    c, f = _MIXER_CUDA_PER_QDIM[kind]
    return c * s.q_dim + 2 * s.num_heads, f * s.q_dim + s.num_heads * (chunk + 10)


def _traced_mixer_bytes(s: Shape, kind: str, overrides: tuple, tokens_shape: tuple[int, int], dtype) -> int:
    """Bytes one mixer forward keeps for backward, traced on the meta device (the project's CPU ops)."""
    from hybridlab.models.mixers import MixerConfig, build_mixer

    cfg = MixerConfig(kind=kind, hidden_size=s.hidden_size, num_heads=s.num_heads, head_k_dim=s.head_dim,
                      head_v_dim=s.head_dim, **dict(overrides))
    with torch.device("meta"):
        mixer = build_mixer(cfg, 0).to(dtype)
        x = torch.empty(*tokens_shape, s.hidden_size, dtype=dtype, requires_grad=True)
    tracker = _Tracker()
    with tracker:
        y, _ = mixer(x)
        live = tracker.live  # saved tensors + output; the graph dies with y
    del y
    return live


def activation_terms(s: Shape, *, batch: int, seq_len: int, precision: str, mixer: str | None = None,
                     mixer_layers: int = 0, overrides: dict | None = None, backend: str = "cuda",
                     mixers_only: bool = False) -> dict[str, int]:
    """Saved-activation bytes: per attention layer, per mixer layer, and per layer boundary (checkpointing)."""
    n = batch * seq_len
    cb, fb = (2, 4) if precision == "bf16" else (4, 4)
    bc, bf = (0, 0) if mixers_only else _block_elems(s)
    ac, af = _attention_elems(s)
    out = {"attention_layer": n * ((bc + ac) * cb + (bf + af) * fb), "mixer_layer": 0,
           "boundary": n * s.hidden_size * cb}
    if mixer and mixer_layers:
        ov = dict(overrides or {})
        if backend == "cpu":
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            per = _traced_mixer_bytes(s, mixer, tuple(sorted(ov.items())), (batch, seq_len), dtype)
        else:
            mc, mf = _mixer_elems_cuda(s, mixer, ov.get("chunk_size", 64))
            per = n * (mc * cb + mf * fb)
        out["mixer_layer"] = n * (bc * cb + bf * fb) + per
    return out


# ---- measurement ------------------------------------------------------------------------------------
class _Tracker(TorchDispatchMode):
    """Live bytes of tensor storages created under this mode (views and in-place results not re-counted)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: dict[int, int] = {}

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self._seen or key in inputs:
                continue
            nbytes = st.nbytes()
            self._seen[key] = nbytes
            self.live += nbytes
            weakref.finalize(st, self._free, key, nbytes)
            self.peak = max(self.peak, self.live)
        return out


def measure_peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn(), peak live bytes of the tensor storages fn allocated), counted by a TorchDispatchMode.

    Storages alive before the call (parameters, optimizer state of earlier steps) are not counted;
    add them yourself. Allocations kernels make internally (workspaces) are not seen.
    """
    tracker = _Tracker()
    with tracker:
        result = fn()
    return result, tracker.peak


# ---- estimates --------------------------------------------------------------------------------------
@dataclass
class Estimate:
    """Named byte terms of one job's peak per rank; `total` combines them as described in `formula`."""

    terms: dict[str, int]
    world_size: int = 1
    notes: list[str] = field(default_factory=list)
    formula: str = "sum"

    @property
    def total(self) -> int:
        t = self.terms
        if self.formula == "train":
            return (t["parameters"] + t["optimizer"] + t["teacher"] + t["cuda_context"] + t["gradients_resident"]
                    + t.get("heldout_memo", 0)
                    + max(t["activations"] + t["logits"], t["gradients"] - t["gradients_resident"] + t["optimizer_step"]))
        return sum(v for k, v in t.items() if not k.startswith("_"))


def _check_positive(**values) -> None:
    for k, v in values.items():
        if not isinstance(v, int) or v < 1:
            raise HybridlabError(f"plan: {k} must be a positive integer, got {v!r}")


def estimate_step(config: Any, *, micro_batch: int, seq_len: int, world_size: int = 1, task: str = "lm",
                  mixer: str | None = None, mixer_layers: int = 0, mixer_overrides: dict | None = None,
                  teacher: Any = None, precision: str = "bf16", checkpointing: bool = True, optimizer: str = "adamw",
                  chunk_tokens: int = 1024, vocab_chunk: int | None = None, logits: str = "chunked",
                  teacher_sharded: bool | None = None, grad_accum: int = 1, overhead_bytes: int | None = None,
                  gpu_mem_bytes: float = 80 * GB, backend: str | None = None,
                  heldout_memo_bytes: int = 0) -> Estimate:
    """Peak bytes per rank of one training step; see the module docstring for the arguments.
    `heldout_memo_bytes`: what a distillation run keeps across its evaluations (the teacher's final hidden
    states of the held-out rows, on every rank), a term of its own.

    Peak = parameters + optimizer + teacher + cuda_context + gradients kept across micro-batches
    + max(activations + logits during the backward, fresh gradients + the optimizer step's temporaries).
    """
    _check_positive(micro_batch=micro_batch, seq_len=seq_len, world_size=world_size, chunk_tokens=chunk_tokens,
                    grad_accum=grad_accum)
    if task not in TASKS or precision not in PRECISIONS or optimizer not in ("adamw", "muon") \
            or logits not in ("chunked", "full"):
        raise HybridlabError(f"plan: task={task!r} precision={precision!r} optimizer={optimizer!r} logits={logits!r}; "
                             f"use task in {TASKS}, precision in {PRECISIONS}, optimizer adamw|muon, logits chunked|full")
    s = shape_of(config)
    cuda = precision == "bf16"
    backend = backend or ("cuda" if cuda else "cpu")
    N, n = world_size, micro_batch * seq_len
    cb = 2 if cuda else 4
    P = model_params(s, mixer, mixer_layers, mixer_overrides)
    P_mix = mixer_layers * mixer_params(s, mixer, mixer_overrides) if mixer and mixer_layers else 0
    P_tr = P_mix if task == "stage1" else P
    layer = max(layer_params(s), layer_params(s) - attention_params(s) + (P_mix // max(mixer_layers, 1)))
    notes = []
    terms: dict[str, int] = {}
    # parameters: fp32 master shards (+ bf16 all-gathered root and two prefetched layers under FSDP2)
    terms["parameters"] = P * 4 // N + ((root_params(s) + 2 * layer) * 2 if cuda else 0)
    # gradients: fp32 shards of the trainable parameters (+ one layer's unsharded bf16 grad and fp32 reduce)
    terms["gradients"] = P_tr * 4 // N + (layer * (2 + 4) if cuda else 0)
    terms["gradients_resident"] = terms["gradients"] if grad_accum > 1 else 0
    if optimizer == "adamw":
        opt = 8 * P_tr
    else:
        hidden = hidden_matrix_params(s, mixer, mixer_layers, mixer_overrides) if task != "stage1" else P_mix
        opt = 4 * hidden + 8 * (P_tr - hidden)
    terms["optimizer"] = opt // N
    # foreach AdamW (CUDA) makes one shard-sized fp32 temporary; the CPU for-loop one per parameter
    terms["optimizer_step"] = P_tr * 4 // N if cuda else 2 * 4 * max(s.vocab_size * s.hidden_size, layer // 4)
    # teacher: bf16 on CUDA (fp32 in the CPU check), replicated if it fits, else FSDP-sharded
    terms["teacher"] = 0
    if task in ("stage1", "stage2"):
        t = shape_of(teacher) if teacher is not None else s
        tb = 2 if cuda else 4
        replicated = dense_params(t) * tb
        sharded = dense_params(t) * tb // N + (root_params(t) + 2 * layer_params(t)) * tb
        if teacher_sharded is None:
            student_side = sum(v for k, v in terms.items() if k != "gradients_resident")
            teacher_sharded = N > 1 and student_side + replicated > 0.6 * gpu_mem_bytes
        terms["teacher"] = sharded if teacher_sharded else replicated
        notes.append(f"teacher {'sharded' if teacher_sharded else 'replicated'}")
    # activations
    acts = activation_terms(s, batch=micro_batch, seq_len=seq_len, precision=precision, mixer=mixer,
                            mixer_layers=mixer_layers, overrides=mixer_overrides, backend=backend,
                            mixers_only=task == "stage1")
    n_attn = s.num_layers - (mixer_layers if mixer else 0)
    per_layer = [acts["attention_layer"]] * n_attn + [acts["mixer_layer"]] * (mixer_layers if mixer else 0)
    full = sum(per_layer)
    ckpt = s.num_layers * acts["boundary"] + max(per_layer)
    transient = n * (2 * s.intermediate_size + 2 * s.hidden_size) * cb  # one layer's backward buffers
    if task == "stage1":
        # teacher inputs/outputs of every mixer layer are captured; only the mixers run (no checkpointing)
        terms["activations"] = mixer_layers * (acts["mixer_layer"] + 2 * acts["boundary"]) + 2 * n * s.q_dim * cb
        notes.append("stage 1 runs the mixers only")
    else:
        terms["activations"] = (ckpt if checkpointing else full) + transient
        notes.append("checkpointing" if checkpointing else "no checkpointing")
    terms["_activations_checkpointed"] = ckpt + transient
    terms["_activations_full"] = full + transient
    # logits of the loss
    if task == "stage1":
        terms["logits"] = 0
    elif logits == "full":
        # measured (CPU fp32): the backward peak holds one fp32 B x T x V buffer beyond the saved
        # activations; under bf16 the bf16 logits are kept besides their fp32 copy
        terms["logits"] = n * s.vocab_size * 4 + (n * s.vocab_size * 2 if cuda else 0)
        notes.append("full B x T x V logits")
    else:
        chunk = min(chunk_tokens, n) * min(vocab_chunk or s.vocab_size, s.vocab_size) * 4
        sides = 2 if task == "stage2" else 1
        head = s.vocab_size * s.hidden_size
        # small logits are kept for the backward instead of recomputed chunk by chunk (losses.KEPT_LOGITS_ELEMENTS):
        # the CE's logits, the KL's p_t and log p_s; the backward then works in place on them
        kept = n * s.vocab_size * sides
        if kept <= KEPT_LOGITS_ELEMENTS and (task == "lm" or (vocab_chunk or s.vocab_size) >= s.vocab_size):
            chunks = kept * 4
        else:
            chunks = (1 + sides) * chunk
        # + the student head's weight-gradient product of the backward (gz^T @ h, [V, D] in the compute dtype,
        # before it is added to the fp32 accumulator) when the head trains
        head_grad = head * cb if task in ("lm", "stage2") else 0
        terms["logits"] = (chunks + (n * s.hidden_size + head) * (4 + (2 if cuda else 0))
                           + sides * n * s.hidden_size * cb + head_grad)
    terms["cuda_context"] = (CUDA_CONTEXT_BYTES if overhead_bytes is None else overhead_bytes) if cuda else 0
    if heldout_memo_bytes:
        terms["heldout_memo"] = int(heldout_memo_bytes)
    return Estimate(terms, N, notes, formula="train")


def estimate_forward(config: Any, *, batch: int, seq_len: int, mixer: str | None = None, mixer_layers: int = 0,
                     mixer_overrides: dict | None = None, precision: str = "bf16", chunk_tokens: int = 1024,
                     backward_through: bool = False) -> Estimate:
    """Peak of an evaluation forward without gradients (held-out CE with chunked logits, analysis passes).

    `backward_through`: the activations are kept for a backward into a few extra parameters (e.g. the
    retrieval-head gates), so every layer's saved tensors count, not just one layer's temporaries.
    """
    _check_positive(batch=batch, seq_len=seq_len, chunk_tokens=chunk_tokens)
    s = shape_of(config)
    cuda = precision == "bf16"
    cb = 2 if cuda else 4
    n = batch * seq_len
    P = model_params(s, mixer, mixer_layers, mixer_overrides)
    acts = activation_terms(s, batch=batch, seq_len=seq_len, precision=precision, mixer=mixer,
                            mixer_layers=mixer_layers, overrides=mixer_overrides)
    layer_peak = max(acts["attention_layer"], acts["mixer_layer"])
    if backward_through:
        n_mix = mixer_layers if mixer else 0
        activations = (s.num_layers - n_mix) * acts["attention_layer"] + n_mix * acts["mixer_layer"] + layer_peak
    else:
        activations = 2 * acts["boundary"] + layer_peak
    terms = {"parameters": P * cb, "activations": activations,
             "logits": 2 * min(chunk_tokens, n) * s.vocab_size * 4,
             "cuda_context": CUDA_CONTEXT_BYTES if cuda else 0}
    return Estimate(terms, 1, ["forward only" + (", backward into gates" if backward_through else "")])


def estimate_generate(config: Any, *, batch: int, context: int, mixer: str | None = None, mixer_layers: int = 0,
                      mixer_overrides: dict | None = None, precision: str = "bf16") -> Estimate:
    """Greedy generation: weights, KV cache of the attention layers, recurrent state of the mixers, prefill."""
    _check_positive(batch=batch, context=context)
    s = shape_of(config)
    cb = 2 if precision == "bf16" else 4
    n_mix = mixer_layers if mixer else 0
    P = model_params(s, mixer, mixer_layers, mixer_overrides)
    acts = activation_terms(s, batch=batch, seq_len=context, precision=precision, mixer=mixer,
                            mixer_layers=mixer_layers, overrides=mixer_overrides)
    kv = 2 * (s.num_layers - n_mix) * batch * context * s.kv_dim * cb
    state = n_mix * batch * (s.num_heads * s.head_dim * s.head_dim * 4 + 3 * 3 * s.q_dim * cb)
    terms = {"parameters": P * cb, "cache": kv + state,
             "activations": 2 * acts["boundary"] + max(acts["attention_layer"], acts["mixer_layer"]),
             "logits": batch * s.vocab_size * 4 * 2,
             "cuda_context": CUDA_CONTEXT_BYTES if precision == "bf16" else 0}
    return Estimate(terms, 1, [f"prefill {context} tokens, KV cache of {s.num_layers - n_mix} attention layers"])


# ---- the preset's jobs ------------------------------------------------------------------------------
@dataclass
class JobPlan:
    job: str
    estimate: Estimate
    fits: bool
    gpus: int | None  # GPUs the verdict is for
    min_gpus: int | None  # smallest allowed count that fits (None: none does)


def _verdict(job: str, make: Callable[[int], Estimate], limit: float, gpus: int | None, sharded: bool) -> JobPlan:
    counts = GPU_COUNTS if sharded else (1,)
    min_n = next((k for k in counts if make(k).total <= limit), None)
    n = gpus if (gpus is not None and sharded) else (min_n or counts[-1]) if gpus is None else 1
    est = make(n)
    return JobPlan(job, est, est.total <= limit, n, min_n)


def plan_preset(raw_config: dict, *, gpu_mem_gb: float = 80, gpus: int | None = None) -> list[JobPlan]:
    """Every training and evaluation job of the active preset of a validated config, with its verdict."""
    from hybridlab.config import resolve

    if not gpu_mem_gb > 0:
        raise HybridlabError(f"plan: --gpu-mem-gb must be > 0, got {gpu_mem_gb!r}")
    if gpus is not None and gpus not in GPU_COUNTS:
        raise HybridlabError(f"plan: --gpus {gpus} is not allowed; use one of {', '.join(map(str, GPU_COUNTS))}")
    C = resolve(raw_config)
    limit = gpu_mem_gb * GB
    prec = "bf16" if C["scale"] == "paper" else "fp32"
    exp, tr, data = C["experiments"], C["train"], C["data"]
    jobs: list[JobPlan] = []
    d = tr["distill"]
    if data["source"] == "offline":
        t = C["models"]["teacher"]
        teachers = {"teacher": {**t, "vocab_size": data["tokenizer_vocab_size"], "tie_word_embeddings": True,
                                "model_type": "qwen3"}}
        tt = tr["teacher"]
        jobs.append(_verdict("teacher pretrain", lambda k: estimate_step(
            teachers["teacher"], micro_batch=tt["micro_batch_size"], seq_len=data["seq_len"], world_size=k,
            precision=prec, checkpointing=False, logits="full", gpu_mem_bytes=limit), limit, gpus, True))
    else:
        teachers = {name.replace("/", "--"): name for name in C["models"]["teachers"]}
    # the held-out curve rows (eval_rows_per_language of each mixture language), whose teacher final hidden
    # states a distillation run keeps on every rank across its evaluations (train.distill.heldout_curve_metrics)
    english = C["languages"]["english"]
    curve_rows = (d.get("eval_rows_per_language") or 0) * len(set(data.get("mono_languages", [])) | {english})
    for tname, tcfg in teachers.items():
        s = shape_of(tcfg)
        n_mix = s.num_layers - _n_fa(s.num_layers, exp["distill"]["fa_ratio"])
        memo = curve_rows * data["seq_len"] * s.hidden_size * (2 if prec == "bf16" else 4)
        for mixer in exp["distill"]["mixers"]:
            for stage in (1, 2):
                st = d[f"stage{stage}"]
                jobs.append(_verdict(f"distill_stage{stage} {tname} {mixer}", lambda k, st=st, s=s, mixer=mixer, stage=stage:
                    estimate_step(s, micro_batch=st["micro_batch_size"], seq_len=data["seq_len"], world_size=k,
                                  task=f"stage{stage}", mixer=mixer, mixer_layers=n_mix, precision=prec,
                                  checkpointing=d["gradient_checkpointing"], chunk_tokens=d["kl_chunk_tokens"],
                                  vocab_chunk=d["kl_vocab_chunk"], grad_accum=st.get("grad_accum", 1),
                                  # what the engine does: train.distill.teacher_sharding (replicate by default)
                                  teacher_sharded=d.get("teacher_sharding", "replicate") == "shard",
                                  gpu_mem_bytes=limit, heldout_memo_bytes=memo), limit, gpus, True))
        jobs.append(_verdict(f"eval_perplexity {tname} {mixer}", lambda k, s=s: estimate_forward(
            s, batch=d["eval_batch_size"], seq_len=data["seq_len"], mixer=exp["distill"]["mixers"][-1],
            mixer_layers=n_mix, precision=prec, chunk_tokens=d["kl_chunk_tokens"]), limit, gpus, False))
        niah = C["eval"]["analysis"]["niah"]
        for ctx in niah["context_tokens"]:
            for label, mx, nm in (("dense", None, 0), (exp["distill"]["mixers"][-1], exp["distill"]["mixers"][-1], n_mix)):
                jobs.append(_verdict(f"eval_niah {tname} {label} {ctx}", lambda k, s=s, mx=mx, nm=nm, ctx=ctx:
                    estimate_generate(s, batch=1, context=ctx, mixer=mx, mixer_layers=nm, precision=prec),
                    limit, gpus, False))
    from hybridlab.config import studies

    if "bld" not in studies(C):  # the real preset runs the multilinguality study alone
        return jobs
    # BLD on Spaced Retrieval (Qwen3 hybrid, 13-token vocabulary; every arm has the same shape)
    from hybridlab.data.spaced_retrieval import VOCAB_SIZE, sequence_length
    from hybridlab.train.arms import layer_kinds

    sr = tr["bld_sr"]
    pat = exp["bld_sr"]["pattern"]
    m = {k: v for k, v in sr["model"].items() if k != "mixer_chunk_size"}
    sr_shape = {**m, "num_hidden_layers": len(pat), "vocab_size": VOCAB_SIZE, "tie_word_embeddings": False,
                "model_type": "qwen3"}
    sr_len = sequence_length(data["spaced_retrieval"]["t"], max(data["spaced_retrieval"]["gaps"]))
    sr_ov = {"chunk_size": sr["model"]["mixer_chunk_size"]} if "mixer_chunk_size" in sr["model"] else None
    jobs.append(_verdict("bld_sr (every arm)", lambda k: estimate_step(
        sr_shape, micro_batch=sr["micro_batch_size"], seq_len=sr_len, world_size=k, mixer=exp["bld_sr"]["mixer"],
        mixer_layers=pat.count("mixer"), mixer_overrides=sr_ov, precision=prec, checkpointing=False,
        logits="full", gpu_mem_bytes=limit), limit, gpus, True))
    # BLD on natural language (SmolLM3 NoPE hybrids), one row per size x mixer (both variants alike)
    nl = tr["bld_nl"]
    vocab = data.get("tokenizer_vocab_size")
    if data["source"] == "hub":  # the vocabulary of BLD-NL's tokenizer's model (its embedding rows)
        from hybridlab.data.tokenizer import tokenizer_plan

        tp = tokenizer_plan(C)
        vocab = shape_of(tp["sources"][tp["bld_nl"]]).vocab_size
    for size, shape in nl["sizes"].items():
        sh = {k: v for k, v in shape.items() if k != "mixer_chunk_size"}
        sh.update(vocab_size=vocab, tie_word_embeddings=True, model_type="smollm3")
        ov = {"chunk_size": shape["mixer_chunk_size"]} if "mixer_chunk_size" in shape else None
        kinds = layer_kinds(exp["bld_nl"]["pattern"], shape["num_hidden_layers"])
        for mixer in exp["bld_nl"]["mixers"]:
            jobs.append(_verdict(f"bld_nl {size} {mixer}", lambda k, sh=sh, ov=ov, mixer=mixer, kinds=kinds:
                estimate_step(sh, micro_batch=nl["micro_batch_size"], seq_len=nl["context_len"], world_size=k,
                              mixer=mixer, mixer_layers=kinds.count("mixer"), mixer_overrides=ov, precision=prec,
                              checkpointing=bool(nl.get("gradient_checkpointing", False)),
                              chunk_tokens=d["kl_chunk_tokens"], grad_accum=nl.get("grad_accum", 1),
                              gpu_mem_bytes=limit), limit, gpus, True))
        hp = C["eval"]["heads_position"]
        big_mixer = exp["bld_nl"]["mixers"][0]
        jobs.append(_verdict(f"eval_retrieval_heads {size}", lambda k, sh=sh, ov=ov, kinds=kinds: estimate_forward(
            sh, batch=hp["retrieval_heads"]["micro_batch_size"], seq_len=hp["retrieval_heads"]["context_len"],
            mixer=big_mixer, mixer_layers=kinds.count("mixer"), mixer_overrides=ov, precision=prec,
            backward_through=True), limit, gpus, False))
    return jobs


TERM_COLUMNS = ("parameters", "gradients", "optimizer", "optimizer_step", "teacher", "activations",
                "_activations_full", "logits", "heldout_memo", "cache", "cuda_context")
_HEAD = {"parameters": "params", "gradients": "grads", "optimizer": "optim", "optimizer_step": "opt.step",
         "teacher": "teacher", "activations": "acts", "_activations_full": "acts(no ckpt)", "logits": "logits",
         "heldout_memo": "memo", "cache": "cache", "cuda_context": "ctx"}


def format_table(plans: list[JobPlan], gpu_mem_gb: float) -> str:
    """A readable table: every term in GB per rank, the peak, the GPU count and the verdict."""
    head = ["job", *(_HEAD[c] for c in TERM_COLUMNS), "peak", "gpus", "verdict", "min gpus", "notes"]
    rows = []
    for p in plans:
        t = p.estimate.terms
        cells = [p.job, *(f"{t[c] / GB:.2f}" if c in t else "-" for c in TERM_COLUMNS),
                 f"{p.estimate.total / GB:.2f}", str(p.gpus),
                 "fits" if p.fits else f"DOES NOT FIT {gpu_mem_gb:g} GB", str(p.min_gpus or "none"),
                 "; ".join(p.estimate.notes)]
        rows.append(cells)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i in (0, len(r) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    legend = ("GB per rank (1e9 bytes). peak = params + optim + teacher + memo + ctx + max(acts + logits, grads + "
              "opt.step) (grads stay resident with gradient accumulation); memo: the held-out teacher states a "
              "distillation run keeps; ctx is a fixed CUDA context/fragmentation allowance.")
    return "\n".join([legend, fmt(head), *(fmt(r) for r in rows)])


def plans_json(plans: list[JobPlan], gpu_mem_gb: float) -> str:
    return json.dumps({"gpu_mem_gb": gpu_mem_gb, "jobs": [
        {"job": p.job, "gpus": p.gpus, "fits": p.fits, "min_gpus": p.min_gpus, "peak_bytes": p.estimate.total,
         "terms": {k.lstrip("_"): v for k, v in p.estimate.terms.items()}, "notes": p.estimate.notes}
        for p in plans]}, indent=1)


def gpus_for(plans: list[JobPlan], prefix: str, gpu_mem_gb: float) -> int:
    """GPUs a rule requests: the largest smallest-fitting count over its jobs; one line if one cannot fit."""
    mine = [p for p in plans if p.job.startswith(prefix)]
    refuse_unfit(mine, gpu_mem_gb)
    return max((p.min_gpus for p in mine), default=1)


def refuse_unfit(plans: list[JobPlan], gpu_mem_gb: float) -> None:
    """One-line HybridlabError for the first job no allowed GPU count fits (the Snakefile calls this at parse)."""
    for p in plans:
        if p.min_gpus is None:
            n = p.estimate.world_size
            raise HybridlabError(
                f"plan: {p.job} needs {p.estimate.total / GB:.1f} GB per GPU at {n} GPU{'s' if n > 1 else ''} > "
                f"{gpu_mem_gb:g} GB; lower its micro batch, enable gradient_checkpointing, or use larger GPUs "
                f"(HYBRIDLAB_GPU_MEM_GB)")
