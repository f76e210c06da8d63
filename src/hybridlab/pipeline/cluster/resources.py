"""Host memory, disk, time limit and node placement of every rule's jobs: the rules' `resources`.

Public API (`hybridlab.pipeline.cluster.requests` and `hybridlab plan` call these):

    rule_resources(raw_config, gpu_plans=None) -> dict[str, RuleResources]
        One entry per rule of the workflow: the estimated peak host RAM of one job (`host_bytes`), the
        disk it writes (`disk_bytes`) and its wall time (`minutes`), with how each was obtained (`basis`).
        The requests derive from them: `mem_mb` and `disk_mb` add HEADROOM and round up to whole GB,
        `runtime` is the wall time capped at MAX_JOB_MINUTES (a longer job resumes from its checkpoints
        over `attempts` submissions; the SLURM profile's `retries` must allow them).
    placement(rule, gpus, cluster) -> Placement
        Nodes and GPUs per node of a GPU job. A job fits one node when it needs at most
        `cluster.gpus_per_node` GPUs; a larger one is refused (one line) unless `cluster.multi_node`
        is set, when it runs on ceil(gpus / gpus_per_node) whole nodes through `srun` + torchrun with a
        c10d rendezvous (hybridlab.pipeline.cluster.launch).
    format_resources(resources) -> str
        The table `hybridlab plan` prints: GPUs, nodes, GPU GB per rank, host RAM, disk and time per rule.

What is derived and what is not. At the paper preset (the GPU cluster) host RAM and disk come from the
model shapes (hybridlab.pipeline.cluster.plan), token budgets and document counts of the config; the training
jobs' wall time comes from their FLOPs at an assumed sustained throughput (SUSTAINED_FLOPS). The other
jobs' wall times, and every request of the CPU presets (smoke, tiny, rehearsal, real: small models, a
laptop or CI box), are fixed allowances (FIXED below). Assumptions are named constants with their
source; measured values say where they were measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybridlab.errors import HybridlabError
from hybridlab.train.config import stage_tokens

GB = 1e9
# Host RSS of a CPU job's Python process before it loads data: 0.25 GB measured (/usr/bin/time -v after
# importing torch, transformers and hybridlab's model modules, CPU build), doubled for allocator slack.
CPU_PROCESS_BYTES = int(0.5 * GB)
# Host RSS of one CUDA process beyond its data (assumed: CUDA runtime, cuBLAS/NCCL host mappings and
# pinned staging buffers; typically 1-3 GB per rank).
CUDA_PROCESS_BYTES = int(3 * GB)
# Requests are the estimate times HEADROOM, rounded up to whole GB (1000 MB).
HEADROOM = 1.25
# Assumed upper bound of one web document's UTF-8 size (FineWeb / FineWeb-2 documents average ~1K
# tokens, 3-5 KB; non-Latin scripts take 2-3 bytes a character).
WEB_DOC_BYTES = 8000
# Assumed sustained bf16 throughput of one GPU in training (about half an A100-80GB's 312 TFLOP/s peak,
# a sixth of an H100's): the training jobs' wall time is their FLOPs at this rate, times TIME_MARGIN,
# plus STARTUP_MINUTES (model loading, evaluations, checkpoints).
SUSTAINED_FLOPS = 150e12
TIME_MARGIN = 1.5
STARTUP_MINUTES = 30
# The longest single submission (a common cluster maximum); a longer job resumes from its checkpoints.
MAX_JOB_MINUTES = 2880
# Parameter counts (rounded up, from the public model cards) of the published models the paper preset's
# analyses load, so the host plan needs no network. A model missing here is a one-line error naming it.
HUB_MODEL_PARAMS = {
    "Qwen/Qwen3-4B": 4.1e9, "Qwen/Qwen3-4B-Base": 4.1e9, "Qwen/Qwen3.5-4B-Base": 5.0e9,
    "ibm-granite/granite-4.1-3b": 3.5e9, "ibm-granite/granite-4.0-h-micro": 3.5e9,
    "ibm-granite/granite-4.0-micro": 3.5e9, "allenai/Olmo-Hybrid-7B": 7.5e9, "allenai/Olmo-3-1025-7B": 7.5e9,
    "inclusionAI/Ring-mini-linear-2.0": 16.5e9, "inclusionAI/Ling-mini-2.0": 16.5e9,
    "CohereLabs/tiny-aya-global": 3.5e9,
}

# SoftCKA keeps the English and one other language's captured token states on the host (fp32) for the
# layers of one pass: tokens per sentence (assumed mean bound: FLORES sentences are ~25-35 tokens in English
# with these tokenizers, more in some scripts) and the widest model's hidden size (the 7B OLMo models: 4096).
SENTENCE_TOKENS = 64
HUB_HIDDEN_BOUND = 4096
# Fixed allowances: rule -> (mem_mb, runtime minutes, disk_mb) for laptop-size presets (smoke, tiny, real) and
# the other hub presets (paper, rehearsal). At the paper preset derived values replace them where a formula exists.
_SMALL = ((2000, 10, 1000), (2000, 10, 1000))
FIXED: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "corpus": ((4000, 30, 2000), (4000, 600, 20000)),
    "tokenizer": ((4000, 30, 1000), (4000, 30, 1000)),
    "mixture": ((8000, 60, 4000), (8000, 2880, 20000)),
    "spaced_retrieval": ((2000, 10, 1000), (2000, 10, 2000)),
    "teacher": ((16000, 60, 2000), (16000, 120, 20000)),
    "convert": ((16000, 30, 2000), (16000, 30, 20000)),
    "distill_stage1": ((16000, 60, 4000), (160000, 600, 100000)),
    "distill_stage2": ((16000, 120, 4000), (160000, 2880, 200000)),
    "assemble_stage1": ((16000, 30, 4000), (64000, 120, 20000)),
    "bld_sr": ((4000, 60, 1000), (4000, 60, 2000)),
    "bld_nl": ((16000, 120, 4000), (160000, 2880, 100000)),
    "eval_softcka_model": ((8000, 30, 1000), (64000, 240, 2000)),
    "eval_softcka": ((4000, 10, 1000), (4000, 10, 1000)),
    "eval_softcka_seed": ((4000, 10, 1000), (4000, 10, 1000)),
    "eval_recency": ((8000, 30, 1000), (64000, 240, 2000)),
    "eval_fertility": ((4000, 20, 1000), (4000, 20, 1000)),
    "eval_perplexity": ((16000, 60, 1000), (64000, 240, 2000)),
    "eval_layer_importance": ((8000, 60, 1000), (96000, 720, 2000)),
    "layer_importance_table": ((2000, 10, 1000), (2000, 10, 1000)),
    "eval_niah": ((8000, 30, 1000), (96000, 1440, 2000)),
    "niah_tables": ((4000, 10, 1000), (4000, 10, 1000)),
    "eval_retrieval_score": ((8000, 60, 1000), (8000, 60, 1000)),
    "eval_retrieval_heads": ((8000, 60, 1000), (80000, 600, 2000)),
    "eval_position_loss": ((8000, 60, 1000), (80000, 600, 2000)),
    "eval_lm_benchmarks": ((80000, 1440, 2000), (80000, 1440, 10000)),
    "lm_benchmarks_table": ((4000, 10, 1000), (4000, 10, 1000)),
    "figure": _SMALL,
    "table": _SMALL,
    "results_page": _SMALL,
}
# Rules that run on GPUs at the paper preset, with the plan job-name prefix their GPU count comes from
# (None: one GPU) and the count the preset's batch settings assume (hybridlab.pipeline.cluster.plan.gpus_for).
GPU_RULES: dict[str, tuple[str | None, int]] = {
    "distill_stage1": ("distill_stage1", 4), "distill_stage2": ("distill_stage2", 4), "bld_nl": ("bld_nl", 4),
    "bld_sr": ("bld_sr", 1), "eval_perplexity": ("eval_perplexity", 1), "eval_niah": ("eval_niah", 1),
    "eval_retrieval_heads": ("eval_retrieval_heads", 1), "eval_softcka_model": (None, 1),
    "eval_recency": (None, 1), "eval_retrieval_score": (None, 1), "eval_position_loss": (None, 1),
    "eval_lm_benchmarks": (None, 1), "eval_layer_importance": (None, 1), "assemble_stage1": (None, 1),
}


def _mb(nbytes: float) -> int:
    """Bytes -> MB rounded up to whole GB (at least 1000)."""
    return max(1000, math.ceil(nbytes / GB) * 1000)


@dataclass
class RuleResources:
    """What one job of `rule` needs: estimates (bytes, minutes) and the requests derived from them."""

    rule: str
    host_bytes: int
    disk_bytes: int
    minutes: int
    basis: str
    gpus: int = 0
    gpu_peak_bytes: int = 0  # largest per-rank GPU estimate of the rule's jobs (hybridlab.pipeline.cluster.plan)
    fixed: bool = False  # a fixed allowance (FIXED), not an estimate
    # one job per model: host bytes of the job of each published model by name, "" for the DAG's models
    by_model: dict[str, int] = field(default_factory=dict)

    def mem_mb_for(self, model: str | None) -> int:
        """mem_mb of the job of `model` (a published model's hub id; None: a model of the DAG)."""
        if not self.by_model:
            return self.mem_mb
        return _mb(self.by_model.get(model or "", self.by_model[""]) * HEADROOM)

    @property
    def mem_mb(self) -> int:
        return int(self.host_bytes / 1e6) if self.fixed else _mb(self.host_bytes * HEADROOM)

    @property
    def disk_mb(self) -> int:
        return int(self.disk_bytes / 1e6) if self.fixed else _mb(self.disk_bytes * HEADROOM)

    @property
    def runtime(self) -> int:
        return min(self.minutes, MAX_JOB_MINUTES)

    @property
    def attempts(self) -> int:
        return math.ceil(self.minutes / MAX_JOB_MINUTES)


@dataclass(frozen=True)
class Placement:
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


CLUSTER_DEFAULTS = {"gpus_per_node": 8, "multi_node": False, "rdzv_port": 29500}


def cluster_settings(view: dict) -> dict:
    """presets.<scale>.cluster of a resolved config with its defaults."""
    return {**CLUSTER_DEFAULTS, **(view.get("cluster") or {})}


def placement(rule: str, gpus: int, cluster: dict, scale: str = "paper") -> Placement:
    """Nodes of a job that needs `gpus` GPUs: one node when they fit, else whole nodes if multi_node is set."""
    per_node = int(cluster["gpus_per_node"])
    if gpus <= per_node:
        return Placement(1, max(gpus, 0))
    if not cluster["multi_node"]:
        raise HybridlabError(
            f"plan: {rule} needs {gpus} GPUs but a node has {per_node} (presets.{scale}.cluster.gpus_per_node); "
            f"set presets.{scale}.cluster.multi_node: true to run it on {math.ceil(gpus / per_node)} nodes "
            f"(srun + torchrun, c10d rendezvous), or use larger GPUs (HYBRIDLAB_GPU_MEM_GB)")
    return Placement(math.ceil(gpus / per_node), per_node)


# ---- derivations (paper preset) -----------------------------------------------------------------------
def _fixed(rule: str, offline: bool, basis: str = "fixed allowance") -> RuleResources:
    mem, minutes, disk = FIXED[rule][0 if offline else 1]
    return RuleResources(rule, int(mem * 1e6), int(disk * 1e6), minutes, basis, fixed=True)


def _hub_params(name: str) -> float:
    from hybridlab.pipeline.cluster.model_shapes import KNOWN_MODELS, dense_params, shape_of

    if name in HUB_MODEL_PARAMS:
        return HUB_MODEL_PARAMS[name]
    if name in KNOWN_MODELS:
        return dense_params(shape_of(name))
    raise HybridlabError(f"plan: the size of {name} is unknown to the host plan; add its parameter count to "
                         "hybridlab.pipeline.cluster.resources.HUB_MODEL_PARAMS")


def distill_flops_per_token(stage: int, *, p_teacher: float, p_student: float, p_trained: float, hidden: int,
                            vocab: int, checkpointing: bool, recompute_heads: bool) -> float:
    """Training FLOPs per token of one distillation stage, counting what the code runs:

    - the frozen teacher's forward, 2 P_teacher;
    - stage 1: the trained mixers' forward and backward, 6 P_trained (they run on the teacher's inputs, once);
    - stage 2: the student's forward and backward, 6 P_student, plus a second forward of the student's decoder
      (2 P_student) when its layers are checkpointed, plus, when the chunked KL recomputes the logits in its
      backward instead of keeping them (`losses.KEPT_LOGITS_ELEMENTS`), both heads once more (2 x 2 D V).
    """
    if stage == 1:
        return 2 * p_teacher + 6 * p_trained
    flops = 2 * p_teacher + 6 * p_student
    if checkpointing:
        flops += 2 * p_student
    if recompute_heads:
        flops += 2 * (2 * hidden * vocab)
    return flops


def _train_minutes(flops: float, gpus: int) -> int:
    return math.ceil(flops / (gpus * SUSTAINED_FLOPS) / 60 * TIME_MARGIN) + STARTUP_MINUTES


def _paper(raw: dict, C: dict, gpu_plans: list, out: dict[str, RuleResources]) -> None:
    from hybridlab.config import studies
    from hybridlab.data.tokenizer import tokenizer_plan
    from hybridlab.train.arms import layer_kinds
    from hybridlab.train.bld_nl import bld_nl_need_tokens
    from hybridlab.pipeline.cluster.disk_plan import disk_preset
    from hybridlab.train.losses import KEPT_LOGITS_ELEMENTS
    from hybridlab.pipeline.cluster.model_shapes import _n_fa, dense_params, mixer_params, model_params, shape_of

    data, exp, tr = C["data"], C["experiments"], C["train"]
    d = tr["distill"]
    seq = data["seq_len"]
    n_mono = len([x for x in data["mono_languages"] if x != C["languages"]["english"]])
    docs_per = data["fineweb2_docs_per_language"]
    eng_docs = data["english_web_docs"]
    # corpus: one language's documents at a time (Python strings, its frame, the parquet writer's batch)
    out["corpus"] = RuleResources(
        "corpus", CPU_PROCESS_BYTES + 3 * max(docs_per, eng_docs) * WEB_DOC_BYTES,
        (n_mono * docs_per + eng_docs) * WEB_DOC_BYTES + int(0.1 * GB), FIXED["corpus"][1][1],
        f"largest language's documents x {WEB_DOC_BYTES} B x 3 (streamed per language); disk: all documents")
    # mixture (multilingual): one language's text and its int32 token pool at a time; rows streamed to disk
    eng_tokens = data["english_share"] * data["mixture_tokens"]
    lang_tokens = max(eng_tokens, (1 - data["english_share"]) * data["mixture_tokens"] / max(n_mono, 1))
    lang_docs = max(docs_per, eng_docs)
    host = CPU_PROCESS_BYTES + 2 * lang_docs * WEB_DOC_BYTES + 2 * 4 * lang_tokens
    disk = 2 * 4 * data["mixture_tokens"]  # per-language row files + tokens.npy
    basis = "largest language: text x 2 + int32 tokens x 2; disk: int32 tokens x 2"
    # English mixture of BLD-NL (streamed): row starts in memory, tokens memory-mapped on disk
    tp = tokenizer_plan(C)
    bld_study = "bld" in studies(C) and bool(tr.get("bld_nl"))
    nl = tr.get("bld_nl") or {}
    need = {}
    if bld_study:  # tokens of every BLD-NL arm (models built on the meta device; computed once)
        vocab = shape_of(tp["sources"][tp["bld_nl"]]).vocab_size
        need = bld_nl_need_tokens(nl["sizes"], {k: v for k, v in nl.items() if k != "sizes"}, exp["bld_nl"],
                                  vocab_size=vocab)
    if bld_study and data.get("bld_nl_stream"):
        rows = max(need.values()) / (nl.get("epochs") or 1) / seq
        host = max(host, CPU_PROCESS_BYTES + rows * 160 + 64 * seq * 8)
        disk = max(disk, rows * seq * 4 + rows * 16)
        basis += "; English stream: 160 B of row starts per row, int32 tokens on disk"
    out["mixture"] = RuleResources("mixture", int(host), int(disk), FIXED["mixture"][1][1], basis)

    teachers = list(C["models"]["teachers"])
    shapes = {t: shape_of(t) for t in teachers}
    n_fa = {t: _n_fa(s.num_layers, exp["distill"]["fa_ratio"]) for t, s in shapes.items()}
    P_t = {t: dense_params(s) for t, s in shapes.items()}
    P_s = {(t, m): model_params(s, m, s.num_layers - n_fa[t]) for t, s in shapes.items()
           for m in exp["distill"]["mixers"]}
    # teacher download: the bf16 checkpoint on disk; the job itself only streams files
    out["teacher"] = RuleResources("teacher", CPU_PROCESS_BYTES + int(2 * GB), int(2 * max(P_t.values())),
                                   FIXED["teacher"][1][1], "download: bf16 checkpoint on disk")
    # convert: the teacher's bf16 weights (in place) and its memory-mapped file pages; the student on disk
    out["convert"] = RuleResources(
        "convert", int(CPU_PROCESS_BYTES + max(2 * P_s[k] + 2 * P_t[k[0]] for k in P_s)),
        int(2 * max(P_s.values())), FIXED["convert"][1][1],
        "student bf16 (converted in place) + teacher file pages; disk: student bf16")
    disks = {p.job: p for p in disk_preset(raw)}

    def gpus_of(rule):
        prefix, least = GPU_RULES[rule]
        if prefix is None:
            return least
        mine = [p for p in gpu_plans if p.job.startswith(prefix)]
        return max([least] + [p.min_gpus or least for p in mine])

    for stage in (1, 2):
        rule = f"distill_stage{stage}"
        n = gpus_of(rule)
        st = d[f"stage{stage}"]
        tokens = stage_tokens(st, seq)  # the global batch does not depend on the process count
        worst = max(P_s, key=P_s.get)
        t, m = worst
        n_mix = shapes[t].num_layers - n_fa[t]
        # the KL keeps a micro-batch's logits (no recompute in backward) only while they fit KEPT_LOGITS_ELEMENTS
        micro_tokens = st["micro_batch_size"] * seq
        per_token = distill_flops_per_token(
            stage, p_teacher=P_t[t], p_student=P_s[worst], p_trained=n_mix * mixer_params(shapes[t], m),
            hidden=shapes[t].hidden_size, vocab=shapes[t].vocab_size,
            checkpointing=bool(d.get("gradient_checkpointing")),
            recompute_heads=2 * micro_tokens * shapes[t].vocab_size > KEPT_LOGITS_ELEMENTS)
        flops = tokens * per_token
        # each rank loads the fp32 student and the bf16 teacher on the host before moving them to its GPU
        host = n * (CUDA_PROCESS_BYTES + 4 * P_s[worst] + 2 * P_t[t])
        disk = max(p.per_run for j, p in disks.items() if j.startswith(rule))
        out[rule] = RuleResources(rule, int(host), int(disk), _train_minutes(flops, n),
                                  f"{n} ranks x (CUDA process + fp32 student + bf16 teacher); time: "
                                  f"{tokens:.3g} tokens x {per_token:.3g} FLOPs (distill_flops_per_token)", gpus=n)
    # BLD-NL: the largest arm
    best = P_nl = 0
    for size, shape in nl.get("sizes", {}).items() if bld_study else ():
        sh = {k: v for k, v in shape.items() if k != "mixer_chunk_size"}
        s = shape_of({**sh, "vocab_size": vocab, "tie_word_embeddings": True, "model_type": "smollm3"})
        n_mix = layer_kinds(exp["bld_nl"]["pattern"], shape["num_hidden_layers"]).count("mixer")
        for m in exp["bld_nl"]["mixers"]:
            P = model_params(s, m, n_mix)
            best, P_nl = max(best, 6 * P * need[f"{m}-{size}"]), max(P_nl, P)
    n = gpus_of("bld_nl")
    out["bld_nl"] = out["bld_nl"] if not bld_study else RuleResources(
        "bld_nl", int(n * (CUDA_PROCESS_BYTES + 4 * P_nl)),
        int(max(p.per_run for j, p in disks.items() if j.startswith("bld_nl"))), _train_minutes(best, n),
        f"{n} ranks x (CUDA process + fp32 model); time: tokens x 6 P of the largest arm", gpus=n)
    # evaluations: the largest model one job loads (bf16) plus its file pages, one CUDA process
    hub = [m for p in C["eval"]["analysis"]["hub_pairs"] for m in (p.get("hybrid"), p.get("dense")) if m]
    largest_hub = max([_hub_params(m) for m in hub], default=0)
    largest_dag = max(list(P_s.values()) + list(P_t.values()) + [P_nl])
    biggest = max(largest_hub, largest_dag)
    sc = C["eval"]["analysis"]["softcka"]
    layers = max(s.num_layers for s in shapes.values()) + 1
    units = (sc["layers_per_pass"] or layers) * len(sc["kinds"])
    dag_hidden = max(s.hidden_size for s in shapes.values())
    def captured(hidden):  # two languages' captured fp32 token states of one SoftCKA layer pass
        return 2 * units * sc["n_sentences"] * SENTENCE_TOKENS * hidden * 4

    for rule in ("eval_softcka_model", "eval_recency", "eval_niah", "eval_lm_benchmarks"):
        # lm-eval reads models of the DAG only (no published hub model)
        size = largest_dag if rule == "eval_lm_benchmarks" else biggest
        hidden = dag_hidden if not hub else max(dag_hidden, HUB_HIDDEN_BOUND)
        data, what = (captured(hidden), "two languages' captured fp32 states of one layer pass") \
            if "softcka" in rule else (2 * GB, "2 GB of data")
        _, minutes, disk = FIXED[rule][1]
        out[rule] = RuleResources(rule, int(CUDA_PROCESS_BYTES + 4 * size + data), int(disk * 1e6), minutes,
                                  f"largest model it loads: bf16 weights + file pages + {what}; time fixed")
        if rule in ("eval_niah", "eval_softcka_model"):  # one job per model: each sized by its own model
            dag_data, hub_data = (captured(dag_hidden), captured(HUB_HIDDEN_BOUND)) if "softcka" in rule \
                else (data, data)
            out[rule].by_model = {"": int(CUDA_PROCESS_BYTES + 4 * largest_dag + dag_data),
                                  **{m: int(CUDA_PROCESS_BYTES + 4 * _hub_params(m) + hub_data) for m in hub}}
            out[rule].basis = f"its model: bf16 weights + file pages + {what} (mem_mb per model); time fixed"
    _, minutes, disk = FIXED["eval_perplexity"][1]
    out["eval_perplexity"] = RuleResources("eval_perplexity", int(CUDA_PROCESS_BYTES + 4 * largest_dag + 2 * GB),
                                           int(disk * 1e6), minutes, "a student: bf16 weights + file pages; time fixed")
    for rule in ("eval_retrieval_heads", "eval_position_loss") if bld_study else ():
        _, minutes, disk = FIXED[rule][1]
        out[rule] = RuleResources(rule, int(CUDA_PROCESS_BYTES + 8 * P_nl + 2 * GB), int(disk * 1e6), minutes,
                                  "a BLD-NL arm: fp32 weights + file pages; time fixed")
    for rule, r in out.items():
        if rule in GPU_RULES and not r.gpus:
            r.gpus = gpus_of(rule)
        mine = [p for p in gpu_plans if rule in GPU_RULES and GPU_RULES[rule][0]
                and p.job.startswith(GPU_RULES[rule][0])]
        r.gpu_peak_bytes = max([p.estimate.total for p in mine], default=0)


def rule_resources(raw_config: dict, gpu_plans: list | None = None) -> dict[str, RuleResources]:
    """Resources of every rule at the active preset (see the module docstring); `gpu_plans` from plan_preset."""
    from hybridlab.config import resolve

    C = resolve(raw_config)
    # Laptop-size presets take the small allowances: the offline ones, and a hub preset reading the FLORES-200 /
    # NTREX-128 copies the repository ships (the real preset: a 135M teacher on a laptop CPU).
    small = C["data"]["source"] == "offline" or "flores200" in (C.get("local_sources") or {})
    out = {rule: _fixed(rule, small) for rule in FIXED}
    if C["scale"] == "paper":
        if gpu_plans is None:
            from hybridlab.pipeline.cluster.plan import plan_preset

            gpu_plans = plan_preset(raw_config)
        _paper(raw_config, C, gpu_plans, out)
    return out


def refused(resources: dict[str, RuleResources], cluster: dict, scale: str = "paper") -> str | None:
    """The one-line refusal of the first rule whose jobs need more GPUs than a node has (multi_node unset)."""
    for r in resources.values():
        try:
            placement(r.rule, r.gpus, cluster, scale)
        except HybridlabError as exc:
            return str(exc)
    return None


def format_resources(resources: dict[str, RuleResources], cluster: dict | None = None, scale: str = "paper") -> str:
    """Per rule: GPUs, nodes, GPU GB per rank, host RAM (estimate and request), disk, wall time and attempts."""
    head = ["rule", "gpus", "nodes", "gpu GB/rank", "host RAM GB", "mem_mb", "disk GB", "disk_mb", "time min",
            "runtime", "attempts", "basis"]
    rows = []
    for r in resources.values():
        try:
            nodes = str(placement(r.rule, r.gpus, cluster, scale).nodes if cluster and r.gpus else 1)
        except HybridlabError:
            nodes = "REFUSED"
        rows.append([r.rule, str(r.gpus), nodes, f"{r.gpu_peak_bytes / GB:.1f}" if r.gpu_peak_bytes else "-",
                     "-" if r.fixed else f"{r.host_bytes / GB:.1f}", str(r.mem_mb),
                     "-" if r.fixed else f"{r.disk_bytes / GB:.1f}", str(r.disk_mb), str(r.minutes), str(r.runtime),
                     str(r.attempts), r.basis])
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    fmt = lambda x: "  ".join(c.ljust(w) if i in (0, len(x) - 1) else c.rjust(w)
                              for i, (c, w) in enumerate(zip(x, widths)))
    legend = (f"Per job of each rule (GB = 1e9 bytes): host RAM and disk estimates; mem_mb / disk_mb = estimate x "
              f"{HEADROOM:g} rounded up to whole GB ('-': a fixed allowance); runtime = time capped at "
              f"{MAX_JOB_MINUTES} min, a longer job resumes from its checkpoints over `attempts` submissions.")
    return "\n".join([legend, fmt(head), *(fmt(x) for x in rows)])
