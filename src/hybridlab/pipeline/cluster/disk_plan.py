"""Disk plan: the checkpoints and published weights every training job kind of a preset keeps, so a
preset's disk need is known before it runs (`hybridlab plan` prints it beside the memory plan).

    disk_preset(config_dict) -> list[DiskPlan]
        Disk of every training job kind: its peak while it runs (checkpoints kept + the one being written,
        the weights-only final checkpoint, the published weights) and what each finished run leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridlab.pipeline.cluster.model_shapes import (
    _n_fa, dense_params, hidden_matrix_params, mixer_params, model_params, shape_of)
from hybridlab.pipeline.cluster.plan import GB


@dataclass
class DiskPlan:
    """Disk of one kind of training job: each of its `runs` keeps `kept` checkpoints and publishes fp32 weights.

    A checkpoint is written next to the kept ones before the oldest goes, so a run peaks at `kept` + 1 of them.
    The end's checkpoint holds `final_checkpoint_bytes` (None: a full one; the weights only with
    `final_checkpoint: weights`). `drops_checkpoints`: the job deletes its checkpoints once its weights are
    published (distillation), so a finished run leaves only those.
    """

    job: str
    runs: int
    checkpoint_bytes: int
    kept: int
    final_bytes: int
    final_checkpoint_bytes: int | None = None
    drops_checkpoints: bool = False

    @property
    def final_checkpoint(self) -> int:
        return self.checkpoint_bytes if self.final_checkpoint_bytes is None else self.final_checkpoint_bytes

    @property
    def per_run(self) -> int:
        """Peak of one run: while a checkpoint is written, at the end's checkpoint, and while publishing."""
        c, k, f = self.checkpoint_bytes, self.kept, self.final_checkpoint
        return max((k + 1) * c, k * c + f, (k - 1) * c + f + self.final_bytes)

    @property
    def at_rest(self) -> int:
        """What one finished run leaves on disk."""
        if self.drops_checkpoints:
            return self.final_bytes
        return (self.kept - 1) * self.checkpoint_bytes + self.final_checkpoint + self.final_bytes

    @property
    def total(self) -> int:
        """What all its runs leave, once finished."""
        return self.at_rest * self.runs


def checkpoint_bytes(params: int, trainable: int, muon: int = 0) -> int:
    """One checkpoint: the fp32 model state, AdamW's two fp32 moments per trainable parameter (one momentum
    buffer for the `muon` of them Muon updates)."""
    return 4 * params + 8 * (trainable - muon) + 4 * muon


def _keep(run: dict) -> int:
    from hybridlab.train.config import TrainConfig

    return int(run.get("keep_last_k") or TrainConfig.__dataclass_fields__["keep_last_k"].default)


def _final(run: dict, params: int) -> int | None:
    """Bytes of the end's checkpoint: the fp32 weights with final_checkpoint: weights, else a full one (None)."""
    return 4 * params if run.get("final_checkpoint") == "weights" else None


def disk_preset(raw_config: dict) -> list[DiskPlan]:
    """Disk of every training job kind of the active preset (checkpoint bytes x kept checkpoints + final
    weights, times its runs: placements x seeds, arms x seeds)."""
    from hybridlab.config import experiment_seeds, placement_seeds, resolve, studies
    from hybridlab.train.arms import layer_kinds, nl_arms, sr_arm_specs

    C = resolve(raw_config)
    exp, tr, data = C["experiments"], C["train"], C["data"]
    out: list[DiskPlan] = []
    if data["source"] == "offline":
        t = C["models"]["teacher"]
        teachers = {"teacher": {**t, "vocab_size": data["tokenizer_vocab_size"], "tie_word_embeddings": True,
                                "model_type": "qwen3"}}
        n = dense_params(shape_of(teachers["teacher"]))
        out.append(DiskPlan("teacher pretrain", 1, checkpoint_bytes(n, n), _keep(tr["teacher"]), 4 * n,
                            _final(tr["teacher"], n)))
    else:
        teachers = {name.replace("/", "--"): name for name in C["models"]["teachers"]}
    d = tr["distill"]
    runs = sum(len(placement_seeds(C, p)) for p in exp["distill"]["placements"])
    for tname, tcfg in teachers.items():
        s = shape_of(tcfg)
        n_mix = s.num_layers - _n_fa(s.num_layers, exp["distill"]["fa_ratio"])
        for mixer in exp["distill"]["mixers"]:
            n = model_params(s, mixer, n_mix)
            mixers = n_mix * mixer_params(s, mixer)
            for stage, trainable in ((1, mixers), (2, n)):
                out.append(DiskPlan(f"distill_stage{stage} {tname} {mixer}", runs, checkpoint_bytes(n, trainable),
                                    _keep(d), 4 * n, _final(d, n), drops_checkpoints=True))
    if "bld" not in studies(C):
        return out
    sr, pat = tr["bld_sr"], exp["bld_sr"]["pattern"]
    m = {k: v for k, v in sr["model"].items() if k != "mixer_chunk_size"}
    from hybridlab.data.spaced_retrieval import VOCAB_SIZE

    s = shape_of({**m, "num_hidden_layers": len(pat), "vocab_size": VOCAB_SIZE, "tie_word_embeddings": False,
                  "model_type": "qwen3"})
    ov = {"chunk_size": sr["model"]["mixer_chunk_size"]} if "mixer_chunk_size" in sr["model"] else None
    n = model_params(s, exp["bld_sr"]["mixer"], pat.count("mixer"), ov)
    muon = hidden_matrix_params(s, exp["bld_sr"]["mixer"], pat.count("mixer"), ov) if sr.get("optimizer") == "muon" else 0
    out.append(DiskPlan("bld_sr (every arm)", len(sr_arm_specs(exp["bld_sr"])) * len(experiment_seeds(C, "bld_sr")),
                        checkpoint_bytes(n, n, muon), _keep(sr), 4 * n, _final(sr, n)))
    nl = tr["bld_nl"]
    vocab = data.get("tokenizer_vocab_size")
    if data["source"] == "hub":
        from hybridlab.data.tokenizer import tokenizer_plan

        tp = tokenizer_plan(C)
        vocab = shape_of(tp["sources"][tp["bld_nl"]]).vocab_size
    arms_per = len(nl_arms(["m"], ["s"]))  # baseline and BLD
    for size, shape in nl["sizes"].items():
        sh = {k: v for k, v in shape.items() if k != "mixer_chunk_size"}
        s = shape_of({**sh, "vocab_size": vocab, "tie_word_embeddings": True, "model_type": "smollm3"})
        ov = {"chunk_size": shape["mixer_chunk_size"]} if "mixer_chunk_size" in shape else None
        n_mix = layer_kinds(exp["bld_nl"]["pattern"], shape["num_hidden_layers"]).count("mixer")
        for mixer in exp["bld_nl"]["mixers"]:
            n = model_params(s, mixer, n_mix, ov)
            # the newest checkpoints come after the unfreeze, under its optimiser
            muon = hidden_matrix_params(s, mixer, n_mix, ov) if exp["bld_nl"]["optimizer_after_unfreeze"] == "muon" else 0
            out.append(DiskPlan(f"bld_nl {size} {mixer}", arms_per * len(experiment_seeds(C, "bld_nl")),
                                checkpoint_bytes(n, n, muon), _keep(nl), 4 * n, _final(nl, n)))
    return out


def format_disk(disks: list[DiskPlan]) -> str:
    """Disk per job kind and in all (GB = 1e9 bytes)."""
    head = ["job", "runs", "checkpoint", "kept", "final ckpt", "weights", "peak per run", "left per run", "all runs"]
    rows = [[p.job, str(p.runs), f"{p.checkpoint_bytes / GB:.2f}", str(p.kept), f"{p.final_checkpoint / GB:.2f}",
             f"{p.final_bytes / GB:.2f}", f"{p.per_run / GB:.2f}", f"{p.at_rest / GB:.2f}", f"{p.total / GB:.1f}"]
            for p in disks]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    legend = ("Disk in GB (1e9 bytes). checkpoint = fp32 model + AdamW's two fp32 moments per trainable parameter "
              "(Muon: one); kept = train.<run>.keep_last_k; final ckpt = the end's checkpoint (train.<run>."
              "final_checkpoint: weights holds the fp32 weights only); weights = the published fp32 model. peak per "
              "run = max((kept + 1) x checkpoint, kept x checkpoint + final ckpt, (kept - 1) x checkpoint + final "
              "ckpt + weights) (a checkpoint is written before the oldest goes); left per run = what a finished "
              "run keeps (distillation deletes its checkpoints once published); all runs = runs x left.")
    left = sum(p.total for p in disks)
    peak = max((p.per_run - p.at_rest for p in disks), default=0)
    return "\n".join([legend, fmt(head), *(fmt(r) for r in rows),
                      f"disk in all: {left / GB:.1f} GB left by {sum(p.runs for p in disks)} runs, "
                      f"{(left + peak) / GB:.1f} GB with the largest run in flight"])
