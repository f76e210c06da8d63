"""One training run for tests/train/test_fsdp.py, started as `python` (1 process) or under torchrun (W).

Usage: fsdp_worker.py OUT_ROOT [--kill-at STEP] SCENARIO... Runs the scenarios one after the other in
this process (one launch, many runs: process start-up dominates at these sizes) into OUT_ROOT/<scenario>.
Writes OUT_ROOT/<scenario>/final.pt (rank 0): the caller's model state after `train` returns (the
engine gathers the trained weights back into rank 0's model), and OUT_ROOT/<scenario>/devices_rank<r>.txt:
the devices of every other rank's caller parameters after `train` returns.
"""

import os
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from hybridlab.models.convert import convert_to_hybrid
from hybridlab.train import distill
from hybridlab.train.config import TrainConfig
from hybridlab.train.distributed import init_distributed
from hybridlab.train.fsdp import Frozen, params_on_meta
from hybridlab.train.freeze import FreezeSchedule
from hybridlab.train.loop import train
from hybridlab.train.tasks import CausalLMTask

V, T = 64, 16


class Kill(Exception):
    pass


def qwen(seed=0, layers=2):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                      max_position_embeddings=T)
    return Qwen3ForCausalLM(cfg)


class BF16Weights:
    """The unsharded reference of FSDP2's bf16 mixed precision: the task runs on bf16 casts of the fp32
    weights (tied weights share one cast, as FSDP's one gathered parameter), so every gradient is the
    bf16 gradient cast to fp32 and accumulates into the fp32 weights in fp32."""

    def __init__(self, task):
        self.task = task

    def loss(self, model, batch):
        from torch.nn.utils.stateless import _reparametrize_module

        casts = {n: p.to(torch.bfloat16) for n, p in model.named_parameters()}
        with _reparametrize_module(model, casts, tie_weights=True):
            return self.task.loss(model, batch)

    def num_tokens(self, batch):
        return self.task.num_tokens(batch)


class _Rows(list):
    """A list of rows with the `langs` a held-out split has."""

    @property
    def langs(self):
        return ["eng_Latn", "fra_Latn"][:len(self)]


def _eval(model, step):
    """A forward under no_grad through the sharded model (as the held-out curves do)."""
    ids = torch.arange(T).reshape(1, T) % V
    return {"mean_logit": model(input_ids=ids).logits.float().mean()}


def run(scenario, out, kill_at):
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, V, (T + 1,), generator=g) for _ in range(24)]
    base = dict(out_dir=out, steps=4, micro_batch_size=2, grad_accum=4, lr=1e-2, ckpt_every=2, log_every=1,
                progress=False, device="cpu", precision="fp32", activation_checkpointing=True)
    hooks, task, model, evaluate = [], CausalLMTask(), qwen(), _eval  # scenario "lm": the plain run
    if scenario == "switch":  # AdamW for 2 updates, then Muon for the hidden matrices
        base.update(optimizer_switch_step=2, optimizer_after_switch="muon")
    elif scenario == "freeze":  # MLPs frozen for the first 2 updates, then trained
        base.update(ckpt_every=1, keep_last_k=4)
        hooks.append(FreezeSchedule(r"\.mlp\.", [(0, 2)]))
    elif scenario == "bf16":
        base.update(precision="bf16")
    elif scenario == "bf16_ref":  # one unsharded process computing with bf16 weights (see BF16Weights)
        base.update(precision="bf16", activation_checkpointing=False)  # a recompute would see the fp32 weights
        task = BF16Weights(task)
    elif scenario == "bf16_shard":  # FSDP2 with bf16 parameters in every launch (a group of one in 1 process);
        # ranks other than 0 pass a skeleton (parameters on meta); the end's checkpoint holds only weights
        base.update(precision="bf16", fsdp="always", final_checkpoint="weights", activation_checkpointing=False)
        if int(os.environ.get("RANK", "0")) != 0:
            with params_on_meta():
                model = qwen()
    elif scenario in ("stage1", "stage2", "stage2_shard", "stage2_docs"):  # distillation of a converted GDN hybrid
        teacher = distill.freeze(qwen(seed=5))
        if scenario == "stage2_shard":  # the frozen teacher FSDP-sharded too (replicated on 1 process)
            teacher = Frozen(teacher, init_distributed("cpu"), shard=True)
        torch.manual_seed(3)
        model = convert_to_hybrid(qwen(seed=5), [1], "gdn")
        data = [row[:T] for row in data]
        if scenario == "stage2_docs":  # data.packing.document_mask: three packed documents per row
            from hybridlab.data.packing import Documents, position_ids

            pos = torch.from_numpy(position_ids([0, 5, 11], T))
            data = [Documents(row, pos) for row in data]
        if scenario == "stage1":
            distill.freeze_all_but_mixers(model)
            task = distill.Stage1Task(teacher, model, inputs="teacher")
        else:
            task = distill.Stage2Task(teacher, chunk_tokens=8)
        if scenario == "stage2_docs":  # held-out curves document-masked too, as distill.py's eval_fn
            rows, langs = distill.heldout_rows(_Rows(data[:2]), None), ["eng_Latn", "fra_Latn"]
            evaluate = lambda m, step: distill.heldout_curve_metrics(m, teacher, rows[0], langs, batch_size=2)
        if scenario == "stage2_shard":  # held-out curves with the sharded teacher, as distill.py's eval_fn
            ids, langs = torch.stack(data[:2]), ["eng_Latn", "fra_Latn"]
            evaluate = lambda m, step: distill.heldout_curve_metrics(m, teacher, ids, langs, batch_size=2)
            evaluate(model, 0)  # before training, as distill.py's step-0 point (every rank: the teacher is sharded)
    if kill_at is not None:
        def killer(step, model, opt):
            if step == kill_at:
                raise Kill(f"killed before update {step}")
        hooks.append(killer)
    base.update(eval_every=2)  # evaluation between updates runs through the FSDP root too
    train(model, task, data, TrainConfig(**base), on_step_start=hooks, eval_fn=evaluate)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, os.path.join(out, "final.pt"))
    else:
        with open(os.path.join(out, f"devices_rank{rank}.txt"), "w") as f:
            f.write(" ".join(sorted({p.device.type for p in model.parameters()})))


def main():
    args = sys.argv[1:]
    root, kill_at = args.pop(0), None
    if args[0] == "--kill-at":
        kill_at = int(args[1])
        args = args[2:]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # one group for all runs (train() reuses a group it did not create)
        torch.distributed.init_process_group("gloo")
    try:
        for scenario in args:
            run(scenario, os.path.join(root, scenario), kill_at)
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
