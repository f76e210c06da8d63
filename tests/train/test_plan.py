"""Memory plan: term arithmetic by hand, estimate vs measured CPU step (within 15 %), CLI and errors."""

import json

import pytest
import torch
from tiny_models import tiny_qwen3

from hybridlab.cli import main
from hybridlab.errors import HybridlabError
from hybridlab.pipeline.cluster import disk_plan, plan

TOY = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
       "intermediate_size": 128, "vocab_size": 512, "tie_word_embeddings": True, "model_type": "qwen3"}


def test_terms_by_hand():
    s = plan.shape_of(TOY)
    # attention: q/o 64x64 each, k/v 64x32 each, q/k norms 16 each; MLP 3*64*128; two norms
    assert plan.attention_params(s) == 2 * 64 * 64 + 2 * 64 * 32 + 32
    layer = 12320 + 3 * 64 * 128 + 128
    assert plan.dense_params(s) == 512 * 64 + 64 + 4 * layer
    est = plan.estimate_step(TOY, micro_batch=2, seq_len=8, world_size=2, precision="bf16", overhead_bytes=0)
    P = plan.dense_params(s)
    t = est.terms
    assert t["parameters"] == P * 4 // 2 + (512 * 64 + 64 + 2 * layer) * 2
    assert t["optimizer"] == 8 * P // 2 and t["optimizer_step"] == 4 * P // 2
    assert t["gradients"] == P * 4 // 2 + layer * 6
    # saved per token and attention layer: compute 2D+4I + 2(Hq+KVhd); fp32 4D+2 + 2(Hq+KVhd)+2H+KV
    per_tok = (2 * 64 + 4 * 128 + 2 * 96) * 2 + (4 * 64 + 2 + 2 * 96 + 8 + 2) * 4
    assert t["_activations_full"] == 16 * (4 * per_tok + (2 * 128 + 2 * 64) * 2)
    assert t["activations"] == 4 * 16 * 64 * 2 + 16 * per_tok + 16 * (2 * 128 + 2 * 64) * 2
    # the 16 x 512 fp32 logits the CE keeps for its backward (under losses.KEPT_LOGITS_ELEMENTS; otherwise two
    # chunks of rows), fp32 grad accumulators + bf16 casts, the final hidden, and the head's bf16 [V, D]
    # weight-gradient product of the backward
    assert t["logits"] == 16 * 512 * 4 + (16 * 64 + 512 * 64) * 6 + 16 * 64 * 2 + 512 * 64 * 2
    assert est.total == (t["parameters"] + t["optimizer"] + t["teacher"]
                         + max(t["activations"] + t["logits"], t["gradients"] + t["optimizer_step"]))
    # a distillation run's held-out teacher memo is a term of its own, added to the peak
    memo = plan.estimate_step(TOY, micro_batch=2, seq_len=8, world_size=2, precision="bf16", overhead_bytes=0,
                              task="stage2", mixer="gdn", mixer_layers=2, heldout_memo_bytes=10**6)
    plain = plan.estimate_step(TOY, micro_batch=2, seq_len=8, world_size=2, precision="bf16", overhead_bytes=0,
                               task="stage2", mixer="gdn", mixer_layers=2)
    assert memo.terms["heldout_memo"] == 10**6 and memo.total == plain.total + 10**6


def test_the_paper_plan_counts_the_held_out_teacher_memo():
    from hybridlab.config import load

    plans = {p.job: p for p in plan.plan_preset(load("config.yaml", {"scale": "paper"}))}
    s = plan.shape_of("Qwen/Qwen3-4B")
    # 8 rows of each of the 27 mixture languages (26 + English) x 4,096 tokens x 2,560 x bf16 = 4.53 GB
    want = 8 * 27 * 4096 * s.hidden_size * 2
    assert plans["distill_stage2 Qwen--Qwen3-4B gdn"].estimate.terms["heldout_memo"] == want
    assert 4.5e9 < want < 4.6e9


def test_hybrid_params_are_exact():
    from hybridlab.models.convert import convert_to_hybrid

    dense = tiny_qwen3(**{k: v for k, v in TOY.items() if k != "model_type"})
    hybrid = convert_to_hybrid(dense, [1], "gdn")
    assert plan.model_params(plan.shape_of(dense.config), "gdn", 3) == sum(p.numel() for p in hybrid.parameters())
    assert plan.dense_params(plan.shape_of(dense.config)) == sum(p.numel() for p in dense.parameters())


def test_measure_peak_bytes_counts_live_storages():
    def fn():
        a = torch.ones(1000, 250)  # 1 MB
        b = a * 2                  # 2 MB live
        del a
        return b + 1               # 2 MB live (b, c)
    out, peak = plan.measure_peak_bytes(fn)
    assert peak == 2_000_000 and out.shape == (1000, 250)


def _resident(model, opt):
    seen = {}
    for t in [*model.parameters(), *(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v))]:
        seen[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _measured_step(model, loss_fn):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step():
        loss_fn().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    step()  # optimizer state exists from here on
    return _resident(model, opt) + plan.measure_peak_bytes(step)[1]


@pytest.mark.parametrize("B,T", [(4, 128), (2, 64)])
def test_estimate_matches_cpu_measurement(B, T):
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.train.distill import Stage2Task
    from hybridlab.train.tasks import CausalLMTask

    teacher = tiny_qwen3(seed=0, **{**{k: v for k, v in TOY.items() if k != "model_type"}, "vocab_size": 1024})
    ids = torch.randint(0, 1024, (B, T))
    measured = _measured_step(teacher, lambda: CausalLMTask().loss(teacher, ids)[0])
    est = plan.estimate_step(teacher.config, micro_batch=B, seq_len=T, precision="fp32", checkpointing=False,
                             logits="full").total
    assert abs(est / measured - 1) < 0.15, (est, measured)

    student = convert_to_hybrid(teacher.eval(), [1], "gdn", mixer_overrides={"chunk_size": 16})
    task = Stage2Task(teacher, chunk_tokens=128)
    measured = _measured_step(student, lambda: task.loss(student, ids)[0])
    est = plan.estimate_step(student.config, micro_batch=B, seq_len=T, precision="fp32", checkpointing=False,
                             task="stage2", mixer="gdn", mixer_layers=3, mixer_overrides={"chunk_size": 16},
                             chunk_tokens=128).total
    assert abs(est / measured - 1) < 0.15, (est, measured)


def test_cli_paper_at_4_gpus(capsys):
    assert main(["plan", "--scale", "paper", "--gpu-mem-gb", "80", "--gpus", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    distill = [j for j in out["jobs"] if j["job"].startswith("distill_stage")]
    assert {j["job"].split()[1] for j in distill} == {"Qwen--Qwen3-4B", "ibm-granite--granite-4.1-3b"}
    assert all(j["fits"] and j["gpus"] == 4 for j in distill)
    assert all(set(j["terms"]) >= {"parameters", "gradients", "optimizer", "teacher", "activations", "logits",
                                   "cuda_context"} for j in distill)
    assert main(["plan", "--scale", "paper", "--gpus", "4"]) == 0
    table = capsys.readouterr().out
    assert "distill_stage2 Qwen--Qwen3-4B gdn" in table and "DOES NOT FIT" not in table


def test_cli_small_gpu_does_not_fit(capsys):
    assert main(["plan", "--scale", "paper", "--gpu-mem-gb", "16", "--gpus", "1", "--json"]) == 0
    jobs = {j["job"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}
    s2 = jobs["distill_stage2 Qwen--Qwen3-4B gdn"]
    # The paper preset replicates the bf16 teacher (8 GB) on every rank: no GPU count fits 16 GB
    # (train.distill.teacher_sharding: shard would be the fix).
    assert not s2["fits"] and s2["min_gpus"] is None and s2["peak_bytes"] > 16e9


@pytest.mark.parametrize("argv,msg", [(["--gpus", "3"], "--gpus 3 is not allowed"),
                                      (["--gpu-mem-gb", "0"], "--gpu-mem-gb must be > 0")])
def test_cli_bad_arguments_one_line(capsys, argv, msg):
    assert main(["plan", "--scale", "paper", *argv]) == 1
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_unknown_model_and_refusal():
    with pytest.raises(HybridlabError, match="not a known hub model"):
        plan.shape_of("nobody/nothing")
    est = plan.estimate_generate("Qwen/Qwen3-4B", batch=1, context=131072)
    bad = plan.JobPlan("eval_niah x", est, False, 1, None)
    with pytest.raises(HybridlabError, match=r"eval_niah x needs \d+\.\d GB per GPU at 1 GPU > 40 GB"):
        plan.refuse_unfit([bad], 40)


def test_disk_of_a_known_shape():
    # 1,000 parameters, all trained with AdamW: 4 (fp32 weights) + 8 (two moments) bytes each
    assert disk_plan.checkpoint_bytes(1000, 1000) == 12000
    assert disk_plan.checkpoint_bytes(1000, 100) == 4800  # stage 1: every weight saved, 100 trained
    assert disk_plan.checkpoint_bytes(1000, 1000, muon=400) == 4000 + 8 * 600 + 4 * 400
    G = 10**9
    # kept 2 full checkpoints of 12 GB: a third is written before the oldest goes (36); a run leaves 2 x 12 + 4
    d = disk_plan.DiskPlan("distill_stage2 x gdn", runs=3, checkpoint_bytes=12 * G, kept=2, final_bytes=4 * G)
    assert d.per_run == 36 * G and d.at_rest == 28 * G and d.total == 84 * G
    lines = disk_plan.format_disk([d]).splitlines()
    assert lines[2].split() == ["distill_stage2", "x", "gdn", "3", "12.00", "2", "12.00", "4.00", "36.00", "28.00",
                                "84.0"]
    assert lines[-1] == "disk in all: 84.0 GB left by 3 runs, 92.0 GB with the largest run in flight"
    # keep 1 and a weights-only end (4 GB): the peak is the second full checkpoint being written (24); at the end
    # 12 + 4, then the full one goes and the weights are published: 4 + 4 left, or 4 once checkpoints are dropped
    w = disk_plan.DiskPlan("bld", runs=2, checkpoint_bytes=12 * G, kept=1, final_bytes=4 * G, final_checkpoint_bytes=4 * G)
    assert (w.per_run, w.at_rest, w.total) == (24 * G, 8 * G, 16 * G)
    dropped = disk_plan.DiskPlan("d", runs=2, checkpoint_bytes=12 * G, kept=1, final_bytes=4 * G,
                            final_checkpoint_bytes=4 * G, drops_checkpoints=True)
    assert (dropped.per_run, dropped.at_rest) == (24 * G, 4 * G)
    # a full end with 1 kept: the end's checkpoint is the peak's second one, then it stays with the weights
    full = disk_plan.DiskPlan("f", runs=1, checkpoint_bytes=12 * G, kept=1, final_bytes=4 * G)
    assert (full.per_run, full.at_rest) == (24 * G, 16 * G)


def test_paper_disk_keeps_one_checkpoint_per_run(capsys):
    from hybridlab import config as cfgmod

    disks = {d.job: d for d in disk_plan.disk_preset(cfgmod.load("config.yaml", {"scale": "paper"}))}
    s2 = disks["distill_stage2 Qwen--Qwen3-4B gdn"]
    assert s2.kept == 1 and s2.runs == 27  # 9 placements (5 fixed, 4 searched) x 3 seeds
    assert 50e9 < s2.checkpoint_bytes < 65e9 and s2.checkpoint_bytes == 3 * s2.final_bytes  # 12 vs 4 bytes a weight
    assert disks["distill_stage1 Qwen--Qwen3-4B gdn"].checkpoint_bytes < s2.checkpoint_bytes
    assert all(d.kept == 1 for d in disks.values())
    # the paper's ends are weights-only; distillation then deletes its checkpoints, BLD keeps the last one
    assert s2.final_checkpoint == s2.final_bytes and s2.at_rest == s2.final_bytes and s2.per_run == 2 * s2.checkpoint_bytes
    nl = next(d for j, d in disks.items() if j.startswith("bld_nl"))
    assert nl.final_checkpoint == nl.final_bytes and nl.at_rest == 2 * nl.final_bytes
    assert main(["plan", "--scale", "paper", "--gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert "distill_stage2 Qwen--Qwen3-4B gdn" in out.split("Disk in GB")[1] and "disk in all: " in out
    assert main(["plan", "--scale", "paper", "--gpus", "4", "--json"]) == 0
    disk = json.loads(capsys.readouterr().out)["disk"]
    assert {j["job"] for j in disk} == set(disks) and all(j["kept"] == 1 for j in disk)


def test_bld_nl_is_planned_with_the_checkpointing_it_trains_with():
    from hybridlab.config import load
    from hybridlab.train.bld_nl import train_config_dict
    from hybridlab.pipeline.cluster.plan import plan_preset

    raw = load("config.yaml", {"scale": "paper"})
    nl = raw["presets"]["paper"]["train"]["bld_nl"]
    assert nl["gradient_checkpointing"] is True  # 16K-token sequences: the paper preset recomputes

    def bld_nl_1b(raw):
        (p,) = [p for p in plan_preset(raw) if p.job == "bld_nl 1b kda"]
        return p.estimate

    with_ckpt = bld_nl_1b(raw)
    nl["gradient_checkpointing"] = False
    without = bld_nl_1b(raw)
    # the plan follows the setting: without recomputation every layer's activations stay live
    assert "checkpointing" in with_ckpt.notes and "no checkpointing" in without.notes
    assert without.terms["activations"] > 5 * with_ckpt.terms["activations"]

    class _Plan:
        def train_config_overrides(self):
            return {}

    run = {"micro_batch_size": 1, "lr": 1e-3, "eval_every": 4, "gradient_checkpointing": True}
    assert train_config_dict(run, out_dir="w", seed=0, steps=4, plan=_Plan())["activation_checkpointing"] is True
    run["gradient_checkpointing"] = False
    assert train_config_dict(run, out_dir="w", seed=0, steps=4, plan=_Plan())["activation_checkpointing"] is False
