"""FSDP2 training under torchrun with 2 gloo processes (CPU), launched the way the rules launch it.

Each scenario of tests/train/fsdp_worker.py runs once in 1 process and once in 2; the sharded run must
reproduce the single-process loss curve and final weights (fp32 reduction order differs, so within
a tolerance), freeze schedules must move exactly the selected parameters, the AdamW -> Muon switch
must work on shards, and a DCP checkpoint written by 2 processes must resume at 2 and at 1. With bf16
parameters (FSDP2's MixedPrecisionPolicy on gloo, at 1 process in a group of one and at 2) the run must give
the unsharded reference's weights, and resume from its DCP checkpoint.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
import torch.distributed.checkpoint as dcp

from hybridlab.train.checkpoint import list_checkpoints
from hybridlab.pipeline.cluster.launch import launch_prefix

WORKER = Path(__file__).with_name("fsdp_worker.py")


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


SCENARIOS = ["lm", "bf16_shard", "stage1", "stage2", "stage2_shard", "stage2_docs", "switch", "freeze"]


def launch(nproc, root, *scenarios, kill_at=None, ok=True):
    cmd = launch_prefix(nproc, python=sys.executable).split() + [str(WORKER), str(root)]
    cmd += [] if kill_at is None else ["--kill-at", str(kill_at)]
    cmd += list(scenarios)
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert (p.returncode == 0) == ok, p.stdout[-2000:] + p.stderr[-4000:]
    return p


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """scenario -> (1-process dir, 2-process dir); all scenarios run in one launch per process count."""
    root = tmp_path_factory.mktemp("fsdp")
    launch(1, root / "one", *SCENARIOS, "bf16_ref")
    launch(2, root / "two", *SCENARIOS)
    return lambda scenario: (root / "one" / scenario, root / "two" / scenario)


def _worker():
    spec = importlib.util.spec_from_file_location("fsdp_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def losses(d):
    return pl.read_parquet(d / "metrics.parquet")["loss"].to_list()


def final(d):
    return torch.load(d / "final.pt", weights_only=True)


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_launcher_is_plain_python_for_one_process_and_torchrun_for_more():
    assert launch_prefix(1, python="py") == "py"
    assert launch_prefix(4, python="py") == "py -m torch.distributed.run --standalone --nproc_per_node 4"


# Weight tolerances. fp32: the runs differ only in the order of fp32 gradient sums. bf16: a weight that
# differs by one fp32 ulp can round to another bf16 value in the next forward, so later gradients differ
# at bf16's relative precision (2^-8) and AdamW turns that into up to lr x 2^-8 per update: 4 updates at
# lr 1e-2 bound it by 1.6e-4 (the runs with bf16 parameters agree bitwise on an AVX2 CPU). Muon: see below.
BF16_TOL = 2e-4


@pytest.mark.parametrize("scenario, tol", [("lm", 1e-5), ("bf16_shard", BF16_TOL), ("stage1", 1e-5), ("stage2", 1e-5),
                                           ("stage2_shard", 1e-5), ("stage2_docs", 1e-5), ("switch", 1e-3)])
def test_two_processes_match_one(runs, scenario, tol):
    one, two = runs(scenario)
    a, b = losses(one), losses(two)
    assert len(a) == len(b) == 4
    assert a == pytest.approx(b, rel=1e-5)
    assert pl.read_parquet(one / "metrics.parquet")["tokens"].to_list() == \
        pl.read_parquet(two / "metrics.parquet")["tokens"].to_list()
    # The weights moved, and by the same amount in both runs. Muon's Newton-Schulz runs in bf16, so
    # gradient rounding differences are amplified there.
    assert max_diff(final(one), final(two)) < tol
    # Checkpoints are DCP shards: one data file per rank.
    ckpt = list_checkpoints(two / "checkpoints")[-1][1]
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_bf16_parameters_sharded_give_the_unsharded_runs_weights(runs):
    """bf16_shard: FSDP2 with MixedPrecisionPolicy(bf16 parameters, fp32 reduction) in a group of one and over
    2 gloo processes; bf16_ref: one unsharded process whose task runs on bf16 casts of the fp32 weights."""
    ref = runs("bf16_ref")[0]
    for d in runs("bf16_shard"):
        assert losses(d) == pytest.approx(losses(ref), rel=1e-5)
        assert max_diff(final(d), final(ref)) < BF16_TOL
    assert max_diff(final(ref), _worker().qwen().state_dict()) > 1e-3  # 4 updates moved the weights past the bound
    # rank 1 passed a skeleton (parameters on meta) and got no gathered weights back
    assert (runs("bf16_shard")[1] / "devices_rank1.txt").read_text() == "meta"
    # the end's checkpoint holds the weights only; the one before it the optimiser state too
    two = runs("bf16_shard")[1] / "checkpoints"
    keys = {s: set(dcp.FileSystemReader(str(p)).read_metadata().state_dict_metadata) for s, p in list_checkpoints(two)}
    assert any(k.startswith("optim.") for k in keys[2]) and not any(k.startswith("optim.") for k in keys[4])
    assert {k for k in keys[4] if k.startswith("model.")} == {k for k in keys[2] if k.startswith("model.")}


def test_bf16_sharded_run_resumes_from_its_dcp_checkpoint_at_another_world_size(runs, tmp_path):
    """Killed after the step-2 checkpoint of a 1-process bf16 FSDP run; 2 processes finish it."""
    full = runs("bf16_shard")[0]
    launch(1, tmp_path, "bf16_shard", kill_at=3, ok=False)
    assert [s for s, _ in list_checkpoints(tmp_path / "bf16_shard" / "checkpoints")] == [2]
    launch(2, tmp_path, "bf16_shard")
    assert losses(tmp_path / "bf16_shard") == pytest.approx(losses(full), rel=1e-5)
    assert max_diff(final(tmp_path / "bf16_shard"), final(full)) < BF16_TOL


def test_document_masked_distillation_trains_on_its_own_context(runs):
    """stage2_docs: the same run as stage2 on Documents rows; masking changes the losses and the eval."""
    docs, plain = runs("stage2_docs")[1], runs("stage2")[1]
    assert abs(losses(docs)[0] - losses(plain)[0]) > 1e-4
    assert "eval/ce" in pl.read_parquet(docs / "metrics.parquet").columns


def test_a_sharded_teacher_gives_the_replicated_teachers_run(runs):
    """stage2_shard: the same run as stage2 with the frozen teacher FSDP-sharded over the 2 processes."""
    rep, shard = runs("stage2")[1], runs("stage2_shard")[1]
    assert losses(rep) == pytest.approx(losses(shard), rel=1e-5)
    # Held-out KL through the sharded teacher (2 processes) = through the plain one (1 process).
    one, two = (pl.read_parquet(d / "metrics.parquet")["eval/kl"].drop_nulls().to_list() for d in runs("stage2_shard"))
    assert len(one) == 2 and all(v > 0 for v in one)
    assert one == pytest.approx(two, rel=1e-4)
    assert max_diff(final(rep), final(shard)) < 1e-5


def _ckpt_weights(ckpt_dir, step, like):
    """Model weights of one DCP checkpoint, read into plain tensors shaped like `like`."""
    sd = {"model": {k: torch.empty_like(v) for k, v in like.items()}}
    dcp.load(sd, checkpoint_id=str(dict(list_checkpoints(ckpt_dir))[step]), no_dist=True)
    return sd["model"]


def test_freeze_moves_exactly_the_selected_parameters_under_sharding(runs):
    one, two = runs("freeze")
    assert losses(one) == pytest.approx(losses(two), rel=1e-5)
    ref = final(two)
    w = {s: _ckpt_weights(two / "checkpoints", s, ref) for s in (1, 2, 3)}
    mlp = [k for k in ref if ".mlp." in k]
    rest = [k for k in ref if ".mlp." not in k]
    assert mlp and rest
    for k in mlp:  # frozen during updates 0 and 1 (bitwise), trained from update 2 on
        assert torch.equal(w[1][k], w[2][k]), k
        assert not torch.equal(w[2][k], w[3][k]), k
    for k in rest:
        assert not torch.equal(w[1][k], w[2][k]), k


def test_kill_and_rerun_continues_and_resumes_at_another_world_size(runs, tmp_path):
    _, full = runs("lm")
    killed, other = tmp_path / "killed" / "lm", tmp_path / "other" / "lm"
    launch(2, tmp_path / "killed", "lm", kill_at=3, ok=False)  # dies before update 3, after the step-2 checkpoint
    assert [s for s, _ in list_checkpoints(killed / "checkpoints")] == [2]
    shutil.copytree(killed, other)
    launch(2, tmp_path / "killed", "lm")  # the same command continues the run
    launch(1, tmp_path / "other", "lm")  # and 1 process can take over the 2-process checkpoint
    for d in (killed, other):
        assert losses(d) == pytest.approx(losses(full), rel=1e-5)
        assert max_diff(final(d), final(full)) < 1e-5
    assert torch.equal(torch.cat([v.flatten() for v in final(killed).values()]),
                       torch.cat([v.flatten() for v in final(full).values()]))  # same world size: bitwise


def test_sharded_muon_is_torch_muon_on_plain_tensors():
    from hybridlab.train.optim import ShardedMuon

    torch.manual_seed(0)
    w0 = torch.randn(12, 20)
    grads = [torch.randn(12, 20) for _ in range(3)]
    out = []
    for cls in (torch.optim.Muon, ShardedMuon):
        w = torch.nn.Parameter(w0.clone())
        opt = cls([w], lr=0.02, weight_decay=0.1, momentum=0.9, adjust_lr_fn="match_rms_adamw")
        for g in grads:
            w.grad = g.clone()
            opt.step()
        out.append(w.detach().clone())
    assert not torch.equal(out[0], w0)
    assert torch.equal(out[0], out[1])


def test_a_one_process_sharded_engine_frees_the_callers_weights_and_gives_them_back():
    """fsdp="always" in this process (a gloo group of one): while sharded, the caller's parameters are meta
    stand-ins and the originals are freed; finish() puts the (unchanged) weights back on the device."""
    import gc
    import weakref

    from hybridlab.train.distributed import init_distributed
    from hybridlab.train.fsdp import Engine

    model = _worker().qwen()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    refs = [weakref.ref(p) for p in model.parameters()]
    ctx = init_distributed("cpu", "always")
    try:
        assert ctx.shards and ctx.grouped and ctx.world_size == 1
        engine = Engine(model, ctx, bf16_params=True)
        gc.collect()
        assert [r() for r in refs] == [None] * len(refs)
        assert {p.device.type for p in model.parameters()} == {"meta"}
        engine.finish()
    finally:
        ctx.close()
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tie survives


def test_finish_gathers_the_weights_without_gradients_or_checkpointed_layers(monkeypatch):
    """At the gather, the last update's gradients are gone and no list holds the sharded layers."""
    from torch.distributed.checkpoint import state_dict as dcp_state_dict

    from hybridlab.train.distributed import init_distributed
    from hybridlab.train.fsdp import Engine

    model = _worker().qwen()
    ctx = init_distributed("cpu", "always")
    seen = {}
    gather = dcp_state_dict.get_model_state_dict

    def spy(m, options=None):
        seen["grads"] = [n for n, p in m.named_parameters() if p.grad is not None]
        seen["ckpt_layers"] = list(engine._ckpt_layers)
        return gather(m, options=options)

    monkeypatch.setattr(dcp_state_dict, "get_model_state_dict", spy)
    try:
        engine = Engine(model, ctx, activation_checkpointing=True)
        ids = torch.randint(0, model.config.vocab_size, (2, 8))
        engine.run(lambda m, x: m(input_ids=x).logits.float().pow(2).mean(), ids).backward()
        assert any(p.grad is not None for p in engine.model.parameters())
        engine.finish()
    finally:
        ctx.close()
    assert seen == {"grads": [], "ckpt_layers": []}
