"""Where the CPU time goes: a `torch.profiler` breakdown of the three mixer ops, the SoftCKA exact path and one
update of the tiny teacher.

Each workload runs once untimed, then `--reps` times under `torch.profiler` (CPU activities only). Every
profiled ATen op's *self* CPU time is put in one category:

- `gemm`: matrix products and triangular solves (`mm`, `bmm`, `baddbmm`, `addmm`, `linalg_solve_triangular`,
  oneDNN's `mkldnn::_linear_pointwise`, ...);
- `elementwise`: arithmetic, exponentials, masks, reductions (`mul`, `exp`, `sum`, `where`, ...);
- `copy`: data movement without arithmetic (`copy_`, `cat`, `stack`, `clone`, `index`, `fill_`, `zero_`);
- `alloc`: allocation (`empty`, `empty_strided`, `zeros` without their fill, `resize_`);
- `attention`: torch's fused CPU attention (`_scaled_dot_product_flash_attention_for_cpu` and its backward);
- `other`: every other op (views, autograd bookkeeping ops, ...), and `untraced` = wall time minus
  the sum of self times (Python, the dispatcher, autograd's engine between ops).

The first touch of freshly allocated memory (page faults) is charged to the op that writes it, so a
large `copy`/`elementwise` share with many allocations often is memory traffic, not arithmetic.
Workloads: `gdn`, `kda`, `gla` (forward + backward at benchmarks/mixers.py's shapes) and `softcka`
(the exact path of benchmarks/softcka.py on random hidden states of the tiny teacher's shape, so no
built model is needed: `--softcka-tokens` tokens per side in sentences of 20 tokens, D = 256) and `teacher`
(one optimiser update of the tiny teacher as benchmarks/train_throughput.py builds it, with the RMSNorms fused as
the training engine fuses them on CPU: forward, chunked cross-entropy, backward, AdamW, on one micro-batch of
random token ids).
The last printed line is one JSON object (shares per workload and the machine description).

    python benchmarks/profile_ops.py [--workloads gdn kda gla softcka teacher] [--threads 2] [--reps 3] [--top 8]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import mixers
from _common import int_at_least
from _machine import describe, describe_line

GEMM_PATTERNS = ("linear_pointwise", "mkldnn_matmul", "_mkl_linear")
GEMM = {"mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "mv", "dot", "vdot", "linalg_solve_triangular",
        "_mkldnn_matmul", "mkldnn_matmul", "linalg_cholesky_ex", "_linalg_eigh", "linalg_vecdot_matmul"}
COPY = {"copy_", "cat", "stack", "clone", "index", "index_select", "gather", "scatter", "fill_", "zero_",
        "contiguous", "_to_copy", "masked_scatter", "index_put_", "_index_put_impl_", "repeat_interleave",
        "flip", "roll", "narrow_copy", "constant_pad_nd", "cumsum"}
ALLOC = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_", "zeros", "new_zeros",
         "zeros_like", "ones", "eye", "full", "arange", "tril_indices"}
VIEWS = {"view", "reshape", "_reshape_alias", "permute", "transpose", "t", "expand", "as_strided", "slice", "select",
         "unsqueeze", "squeeze", "diagonal", "unbind", "split", "chunk", "detach", "alias", "unflatten", "flatten",
         "_unsafe_view", "view_as", "numpy_T", "mT", "lift_fresh", "matmul", "linear", "einsum", "to",
         "result_type", "item", "_local_scalar_dense", "is_nonzero", "broadcast_tensors"}
ELEMENTWISE_HINT = ("mul", "add", "sub", "div", "exp", "log", "neg", "sum", "mean", "where", "masked_fill", "tril",
                    "triu", "sqrt", "rsqrt", "pow", "square", "sigmoid", "softmax", "clamp", "max", "min", "abs",
                    "lt", "gt", "le", "ge", "eq", "ne", "norm", "addcmul", "addcdiv", "lerp", "logsumexp", "silu",
                    "relu", "gelu", "tanh", "cos", "sin", "sort", "topk", "argmax", "any", "all", "bitwise",
                    "logical", "isfinite", "nan", "vecdot", "prod", "var", "std", "amax", "amin", "reciprocal",
                    "embedding", "cross_entropy", "nll", "threshold")


def category(name: str) -> str:
    op = name.split("::")[-1]
    if "scaled_dot_product" in name:
        return "attention"
    if any(pat in name for pat in GEMM_PATTERNS):  # oneDNN's fused linear (inference-mode nn.Linear)
        return "gemm"
    if not name.startswith("aten::"):
        return "other"
    if op in GEMM:
        return "gemm"
    if op in COPY:
        return "copy"
    if op in ALLOC:
        return "alloc"
    if op in VIEWS:
        return "other"
    if any(h in op for h in ELEMENTWISE_HINT):
        return "elementwise"
    return "other"


def mixer_workload(kind: str):
    inputs = {n: t.requires_grad_() for n, t in mixers.make_inputs(kind != "gdn").items()}
    if kind == "gla":
        del inputs["beta"]
    fn = mixers.contenders(kind, 32)["hybridlab"]

    def run():
        for t in inputs.values():
            t.grad = None
        fn(inputs).sum().backward()
    return run


def softcka_workload(tokens: int, dim: int = 256, sentence_len: int = 20):
    from hybridlab.eval.softcka import sentence_gram, soft_cka

    gen = torch.Generator().manual_seed(0)
    n_sent = tokens // sentence_len
    offsets = torch.arange(0, (n_sent + 1) * sentence_len, sentence_len)
    eng = torch.randn(n_sent * sentence_len, dim, generator=gen)
    x = torch.randn(n_sent * sentence_len, dim, generator=gen)

    def run():
        k = sentence_gram(eng, offsets)
        soft_cka((eng, offsets), (x, offsets), method="exact", eng_gram=k)
    return run


def teacher_workload():
    import train_throughput
    from hybridlab.config import load, resolve
    from hybridlab.models.fused import fuse_rms_norms

    C = resolve(load(train_throughput.ROOT / "config.yaml", {"scale": "tiny"}))
    setup = train_throughput.setup_teacher(C)
    fuse_rms_norms(setup.model)  # as the training engine does on CPU (train.fsdp.Engine)
    batch = setup.dataset[: setup.run["micro_batch_size"]]
    opt = torch.optim.AdamW(setup.model.parameters(), lr=setup.run["lr"])

    def run():
        loss, _ = setup.task.loss(setup.model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return run


WORKLOADS = {"gdn": lambda a: mixer_workload("gdn"), "kda": lambda a: mixer_workload("kda"),
             "gla": lambda a: mixer_workload("gla"), "softcka": lambda a: softcka_workload(a.softcka_tokens),
             "teacher": lambda a: teacher_workload()}
CATEGORIES = ("gemm", "attention", "elementwise", "copy", "alloc", "other", "untraced")


def breakdown(run, reps: int, top: int) -> dict:
    run()  # warm-up: first-touch allocations, thread pool
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            run()
    wall = (time.perf_counter() - start) / reps
    per_cat: dict[str, float] = defaultdict(float)
    per_op: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        self_s = evt.self_cpu_time_total / 1e6 / reps
        per_cat[category(evt.key)] += self_s
        per_op[evt.key] += self_s
    traced = sum(per_cat.values())
    per_cat["untraced"] = max(wall - traced, 0.0)
    total = sum(per_cat.values())
    return {
        "wall_ms": 1e3 * wall,
        "shares": {k: per_cat.get(k, 0.0) / total for k in CATEGORIES},
        "top_ops_ms": {k: round(1e3 * v, 2) for k, v in sorted(per_op.items(), key=lambda kv: -kv[1])[:top]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--threads", type=int_at_least(1), default=2)
    ap.add_argument("--reps", type=int_at_least(1), default=3)
    ap.add_argument("--top", type=int_at_least(1), default=8, help="ops listed by self time")
    ap.add_argument("--softcka-tokens", type=int_at_least(20), default=20000)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    machine = describe()
    print(describe_line(machine))
    report = {"machine": machine, "threads": args.threads, "reps": args.reps}
    for name in args.workloads:
        run = WORKLOADS[name](args)
        res = breakdown(run, args.reps, args.top)
        report[name] = res
        shares = "  ".join(f"{k} {100 * v:4.1f}%" for k, v in res["shares"].items())
        print(f"{name:8s} {res['wall_ms']:8.1f} ms  {shares}")
        print("         top: " + ", ".join(f"{k.removeprefix('aten::')} {v:.1f}" for k, v in res["top_ops_ms"].items()))
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
