"""BLD plans and the Spaced Retrieval trainer pieces: windows, freezing in the real loop, grad-norm groups,
optimiser switch, long-gap resampling, the SR task's loss and counts, score checkpoints."""

import json

import numpy as np
import polars as pl
import pytest
import torch

from hybridlab.data import spaced_retrieval as sr
from hybridlab.errors import HybridlabError
from hybridlab.train import spaced_retrieval as srt
from hybridlab.train.bld import FreezeArm, grad_norm_groups, layer_sites, plan_bld, windows_to_steps
from hybridlab.train.config import TrainConfig
from hybridlab.train.loop import train

GAPS = (2, 6)


def tiny_model(seed=0):
    cfg = srt.SRModelConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            intermediate_size=32, mixer_overrides={"chunk_size": 8})
    return srt.build_sr_model(cfg, seed)


def records(n=64, gaps=GAPS, weights=(0.5, 0.5), seed=0):
    cfg = sr.SpacedRetrievalConfig(t=3, gaps=gaps, gap_weights=weights, n_train=n, n_val=8, n_test=8, seed=seed)
    return sr.generate_split(cfg, "train")


def test_windows_to_steps_rounds_half_up_and_keeps_one_update():
    assert windows_to_steps([(0, 0.1)], 30) == [(0, 3)]
    assert windows_to_steps([(0, 0.05)], 30) == [(0, 2)]  # 1.5 -> 2 (half up, exact rational)
    assert windows_to_steps([(0.2, 0.3)], 10) == [(2, 3)]
    assert windows_to_steps([(0, 0.01)], 10) == [(0, 1)]  # 0.1 update -> at least one
    assert windows_to_steps([(0.5, None)], 10) == [(5, None)]
    with pytest.raises(HybridlabError, match="never freezes"):
        windows_to_steps([(0.99, 1.0)], 10)
    with pytest.raises(HybridlabError, match="0 <= start < end <= 1"):
        FreezeArm("bad", ((0.3, 0.2),))


def test_update_windows_are_taken_as_written_and_must_fit_the_run():
    from hybridlab.train.bld import arm_update_windows

    arm = FreezeArm("w", ((0, 0.1),), update_windows=((5, 25), (60, None)))
    assert arm_update_windows(arm, 240) == [(0, 24), (5, 25), (60, None)]
    with pytest.raises(HybridlabError, match=r"update window \[230, 250\) does not fit a run of 240 updates"):
        arm_update_windows(FreezeArm("w", update_windows=((230, 250),)), 240)
    with pytest.raises(HybridlabError, match="does not fit"):
        arm_update_windows(FreezeArm("w", update_windows=((240, None),)), 240)
    with pytest.raises(HybridlabError, match="whole updates with 0 <= start < end"):
        FreezeArm("w", update_windows=((5, 5),))
    with pytest.raises(HybridlabError, match="whole updates"):
        FreezeArm("w", update_windows=((0.5, 2),))


def test_layer_sites_and_plan_select_exactly_the_recurrent_blocks():
    model = tiny_model()
    sites = layer_sites(model)
    assert [s.kind for s in sites] == ["kda", "full_attention", "kda", "full_attention"]
    names = [n for n, _ in model.named_parameters()]
    block = plan_bld(model, FreezeArm("b", ((0, 0.5),), scope="block"), 10)
    assert block.recurrent_layers == [0, 2] and block.windows == [(0, 5)]
    assert set(block.frozen_names) == {n for n in names if n.startswith(("model.layers.0.", "model.layers.2."))}
    assert any("mlp" in n for n in block.frozen_names)
    mixer = plan_bld(model, FreezeArm("m", ((0, 0.5),), scope="mixer"), 10)
    assert set(mixer.frozen_names) == {n for n in names
                                       if n.startswith(("model.layers.0.self_attn.", "model.layers.2.self_attn."))}
    assert not any("mlp" in n or "layernorm" in n for n in mixer.frozen_names)
    base = plan_bld(model, FreezeArm("baseline"), 10)
    assert base.schedules == [] and base.train_config_overrides() == {}


def test_optimizer_switch_at_unfreeze_step():
    model = tiny_model()
    plan = plan_bld(model, FreezeArm("f", ((0, 0.2),), optimizer_after_unfreeze="muon"), 30)
    assert plan.train_config_overrides() == {"optimizer_switch_step": 6, "optimizer_after_switch": "muon"}
    assert plan.frozen_at(5) and not plan.frozen_at(6)
    assert plan_bld(model, FreezeArm("b", optimizer_after_unfreeze="muon"), 30).optimizer_switch_step is None


def test_grad_norm_groups_partition_mixer_parameters():
    model = tiny_model()
    groups = grad_norm_groups(model)
    assert set(groups) == {"layer0/kda", "layer1/full_attention", "layer2/kda", "layer3/full_attention",
                           "kda", "full_attention"}
    names = [n for n, _ in model.named_parameters()]
    kda = {n for n in names if groups["kda"](n)}
    assert kda == {n for n in names if groups["layer0/kda"](n) or groups["layer2/kda"](n)}
    assert all(".self_attn.mixer." in n for n in kda)
    assert {n for n in names if groups["full_attention"](n)} == {
        n for n in names if n.startswith(("model.layers.1.self_attn.", "model.layers.3.self_attn."))}


def test_freeze_window_in_the_real_loop(tmp_path):
    """Frozen blocks stay bitwise still inside the window and move after it; attention always moves;
    the logged KDA gradient norm is 0 while frozen."""
    model = tiny_model()
    total = 4
    plan = plan_bld(model, FreezeArm("f", ((0, 0.5),)), total)
    kda_w = dict(model.named_parameters())["model.layers.0.self_attn.mixer.q_proj.weight"]
    mlp_w = dict(model.named_parameters())["model.layers.2.mlp.up_proj.weight"]
    attn_w = dict(model.named_parameters())["model.layers.1.self_attn.q_proj.weight"]
    snaps = []

    def snap(step, model, opt):
        snaps.append((step, kda_w.detach().clone(), mlp_w.detach().clone(), attn_w.detach().clone()))

    cfg = TrainConfig(out_dir=str(tmp_path), steps=total, micro_batch_size=8, lr=1e-2, warmup_steps=0, log_every=1,
                      progress=False, seed=0, **plan.train_config_overrides())
    task = srt.SpacedRetrievalTask(GAPS)
    train(model, task, sr.SpacedRetrievalDataset(records()), cfg, collate_fn=sr.collate,
          on_step_start=[*plan.schedules, snap], grad_norm_groups=grad_norm_groups(model))
    s0, s2 = snaps[0], snaps[2]  # before update 0, before update 2 (= after the two frozen updates)
    assert torch.equal(s0[1], s2[1]) and torch.equal(s0[2], s2[2])
    assert not torch.equal(s0[3], s2[3])
    assert not torch.equal(s2[1], kda_w.detach()) and not torch.equal(s2[2], mlp_w.detach())
    m = pl.read_parquet(tmp_path / "metrics.parquet")
    assert m["grad_norm/kda"].to_list()[:2] == [0.0, 0.0]
    assert all(v > 0 for v in m["grad_norm/kda"].to_list()[2:])
    assert all(v > 0 for v in m["grad_norm/full_attention"].to_list())
    acc = srt.add_accuracy_columns(m, GAPS)
    for g in GAPS:
        ok = acc[f"sr/digits/gap{g}"] > 0
        expect = acc[f"sr/correct/gap{g}"] / acc[f"sr/digits/gap{g}"]
        assert np.allclose(acc[f"acc/gap{g}"].filter(ok).to_numpy(), expect.filter(ok).to_numpy())


@pytest.mark.parametrize("by_length", [True, False])
def test_task_loss_on_padded_batch_equals_per_example_answer_ce(by_length):
    """Right-padded mixed-gap batch (one padded forward with attention_mask, or one trimmed forward per
    length) == unpadded per-example CE on the answer digits; counts match a per-example argmax."""
    torch.manual_seed(0)
    model = tiny_model().eval()
    rec = records(n=6)
    assert len(set(rec.gaps_N[:6].tolist())) == 2
    batch = sr.make_batch(rec, range(6))
    task = srt.SpacedRetrievalTask(GAPS, by_length=by_length)
    with torch.no_grad():
        loss, scalars = task.loss(model, batch)
        nll, n, correct = 0.0, 0, {g: 0 for g in GAPS}
        for i in range(6):
            ex = sr.build_example(rec.digits_NK[i], int(rec.gaps_N[i]))
            logits = model(input_ids=ex["input_ids"][None]).logits[0]
            pos = ex["answer_pos"]
            lp = torch.log_softmax(logits[pos].double(), -1)
            nll -= lp.gather(1, ex["answer_digits"][:, None]).sum().item()
            n += len(pos)
            correct[int(rec.gaps_N[i])] += int((logits[pos].argmax(-1) == ex["answer_digits"]).sum())
    assert loss.item() == pytest.approx(nll / n, rel=1e-4)
    for g in GAPS:
        assert scalars[f"sr/correct/gap{g}"] == correct[g]
        assert scalars[f"sr/digits/gap{g}"] == 3 * int((rec.gaps_N[:6] == g).sum())
    assert task.num_tokens(batch) == int(sum(sr.sequence_length(3, int(g)) for g in rec.gaps_N[:6]))


def test_task_gradients_same_with_and_without_length_groups():
    model = tiny_model().double()
    batch = sr.make_batch(records(n=8), range(8))
    grads = []
    for by_length in (True, False):
        model.zero_grad()
        srt.SpacedRetrievalTask(GAPS, by_length=by_length).loss(model, batch)[0].backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-10), name


def test_resample_long_gap_exact_mix_and_reuse():
    rec = records(n=100)
    for f in (0.0, 0.25, 0.75, 1.0):
        out = srt.resample_long_gap(rec, f, seed=3)
        assert len(out) == 100 and int((out.gaps_N == 6).sum()) == round(f * 100)
    out = srt.resample_long_gap(rec, 0.25, seed=3)
    # 25 long examples drawn without replacement from the 50 available: all distinct, all from the split
    long_rows = {out.digits_NK[i].tobytes() for i in np.flatnonzero(out.gaps_N == 6)}
    pool = {rec.digits_NK[i].tobytes() for i in np.flatnonzero(rec.gaps_N == 6)}
    assert long_rows <= pool
    # 75 short ones from a pool of 50: every pool example used at least once
    short_rows = [out.digits_NK[i].tobytes() for i in np.flatnonzero(out.gaps_N == 2)]
    assert set(short_rows) == {rec.digits_NK[i].tobytes() for i in np.flatnonzero(rec.gaps_N == 2)}
    assert np.array_equal(srt.resample_long_gap(rec, 0.25, seed=3).digits_NK, out.digits_NK)
    with pytest.raises(HybridlabError, match="at least two gaps"):
        srt.resample_long_gap(records(n=10, gaps=(4,), weights=(1.0,)), 0.5, seed=0)


def test_score_steps_and_checkpointer(tmp_path):
    assert srt.score_steps([0, 0.05, 0.1, 1.0], 30) == [0, 2, 3, 30]
    assert srt.score_steps([0.1, 0.1001], 10) == [1]
    model = tiny_model()
    ck = srt.ScoreCheckpointer(str(tmp_path / "sc"), [0, 2])
    for step in range(3):
        ck(step, model)
    assert ck.written == [0, 2]
    from hybridlab.models.io import load_hybrid

    loaded = load_hybrid(ck.path(2))
    ids = torch.tensor([[10, 1, 2, 3, 11, 11, 10, 1, 2]])
    assert torch.allclose(loaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits, atol=1e-6)
    assert json.loads((ck.path(0) / "hybrid.json").read_text())["layer_types"][0] == "kda"


def test_arm_from_dict_and_errors():
    arm = srt.SRArm.from_dict({"name": "window0.2+0.1", "windows": [[0.2, 0.3]], "scope": "mixer",
                               "optimizer_after_unfreeze": None})
    assert arm.freeze.windows == ((0.2, 0.3),) and arm.long_gap_fraction is None
    assert srt.SRArm.from_dict({"name": "longgap0.25", "long_gap_fraction": 0.25}).long_gap_fraction == 0.25
    with pytest.raises(HybridlabError, match="allowed keys"):
        srt.SRArm.from_dict({"name": "x", "freeze": 1})
    with pytest.raises(HybridlabError, match="scope"):
        srt.SRArm.from_dict({"name": "x", "scope": "layer"})
    with pytest.raises(HybridlabError, match="pattern"):
        srt.SRModelConfig(hidden_size=8, num_attention_heads=1, num_key_value_heads=1, head_dim=8,
                          intermediate_size=8, pattern=("mixer", "mixer"))
