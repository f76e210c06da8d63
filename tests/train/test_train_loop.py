"""The shared training loop: config, schedules, param groups, Muon, resume, determinism, NaN stop."""

import dataclasses
import math

import polars as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.train.checkpoint import list_checkpoints
from hybridlab.train.config import TrainConfig, stage_tokens, tokens_per_update
from hybridlab.train.loop import train
from hybridlab.train.metrics import NONDETERMINISTIC_COLUMNS
from hybridlab.train.optim import HybridOptimizer, build_param_groups
from hybridlab.train.sampler import EpochSampler, epoch_permutation, rows_after
from hybridlab.train.schedule import lr_factor

V, D, T = 11, 8, 9


class TinyLM(nn.Module):
    def __init__(self, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.norm = nn.LayerNorm(D)
        self.mlp = nn.Linear(D, D)
        self.drop = nn.Dropout(dropout)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.drop(torch.tanh(self.mlp(self.norm(h))))
        return self.lm_head(h)


class LMTask:
    def __init__(self):
        self.nan_from_step = None
        self.step = 0

    def loss(self, model, batch):
        ids = batch["input_ids"]
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
        if self.nan_from_step is not None and self.step >= self.nan_from_step:
            loss = loss * float("nan")
        return loss, {"ppl": loss.detach().exp()}

    def num_tokens(self, batch):
        return batch["input_ids"][:, 1:].numel()


def make_data(n=20):
    g = torch.Generator().manual_seed(1)
    starts = torch.randint(0, V, (n,), generator=g)
    # Each sequence counts up mod V: learnable, so the loss must go down.
    return [{"input_ids": (s + torch.arange(T)) % V} for s in starts]


def make_model(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyLM(**kw)


def cfg(tmp_path, name="run", **kw):
    base = dict(out_dir=str(tmp_path / name), steps=8, micro_batch_size=2, grad_accum=2, lr=1e-2,
                warmup_steps=2, log_every=1, progress=False, weight_decay=0.1)
    base.update(kw)
    return TrainConfig(**base)


def run(c, model=None, task=None, **kw):
    model = model or make_model()
    return model, train(model, task or LMTask(), make_data(), c, **kw)


def det_metrics(path):
    return pl.read_parquet(path).drop(list(NONDETERMINISTIC_COLUMNS))


# ---- config and schedule -------------------------------------------------------------------------
def test_config_validation_names_every_bad_field_in_one_line(tmp_path):
    with pytest.raises(HybridlabError) as e:
        TrainConfig(out_dir=str(tmp_path), steps=5, lr=-1.0, schedule="step", optimizer="sgd")
    msg = str(e.value)
    assert "\n" not in msg
    parts = [p.strip() for p in msg.split(":", 1)[1].split(";")]
    assert any(p.startswith("lr=-1.0") for p in parts)
    assert any(p.startswith("schedule='step'") for p in parts)
    assert any(p.startswith("optimizer='sgd'") for p in parts)
    with pytest.raises(HybridlabError) as e:
        TrainConfig(out_dir="x", steps=1, fsdp="yes", final_checkpoint="none")
    assert "fsdp='yes': must be one of ('auto', 'always')" in str(e.value)
    assert "final_checkpoint='none': must be one of ('full', 'weights')" in str(e.value)
    # where checkpoints go and how the work is laid out do not change the trajectory: not in the hash
    assert TrainConfig(out_dir="x", steps=1, fsdp="always", final_checkpoint="weights").config_hash() == \
        TrainConfig(out_dir="x", steps=1).config_hash()
    with pytest.raises(HybridlabError, match="exactly one"):
        TrainConfig(out_dir="x")
    with pytest.raises(HybridlabError, match="unknown TrainConfig keys"):
        TrainConfig.from_dict({"out_dir": "x", "steps": 3, "learning_rate": 1})
    c = TrainConfig(out_dir="x", token_budget=1000, seq_len=10, micro_batch_size=4, grad_accum=2)
    assert c.total_steps() == math.ceil(1000 / 80)


def test_config_sections_allow_what_the_training_loop_allows():
    """A training setting has one typed form: a distillation stage, the teacher run and a BLD-SR run accept a
    value of a loop setting exactly when TrainConfig does (null aside: the loop's null means unset)."""
    import jsonschema

    from hybridlab.config_spec.schema import dataclass_json_schema
    from hybridlab.config_spec.train_sections import BldSrTrain, DistillStage, Run, TrainRun

    def accepts(cls):
        v = jsonschema.Draft202012Validator(dataclass_json_schema(cls))
        return lambda key, value: not [e for e in v.iter_errors({key: value}) if list(e.path)[:1] == [key]]

    engine = accepts(TrainRun)
    probes = [-1, 0, 0.5, 1, 2, 1e-3, "cosine", "linear", "step", "adamw", "muon", "sgd", "bf16", "fast", "auto",
              "always", "full", "weights", True]
    for cls in (DistillStage, Run, BldSrTrain):
        section = accepts(cls)
        shared = {f.name for f in dataclasses.fields(cls)} & {f.name for f in dataclasses.fields(TrainRun)}
        assert {"lr", "schedule", "optimizer", "warmup_steps", "micro_batch_size"} <= shared
        for key in shared:
            for value in probes:
                assert section(key, value) == engine(key, value), (cls.__name__, key, value)


def test_tokens_per_stage_one_rule():
    """Steps x micro-batch x accumulation x sequence length, or the token budget; the same whatever the process
    count (the global batch does not scale with ranks), and 0 for a section without a length."""
    assert tokens_per_update(4, 2, 10) == 80
    assert stage_tokens({"steps": 3, "micro_batch_size": 4, "grad_accum": 2}, 10) == 240
    assert stage_tokens({"steps": 3, "micro_batch_size": 4}, 10) == 120
    assert stage_tokens({"token_budget": 1000, "steps": 3, "micro_batch_size": 4}, 10) == 1000
    assert stage_tokens({}, 10) == 0
    assert TrainConfig(out_dir="x", token_budget=240, seq_len=10, micro_batch_size=4, grad_accum=2).total_steps() == 3


def test_lr_schedule_hand_computed():
    # total 10, warmup 2, min ratio 0.1: progress x = (step - 2) / 8 after warm-up
    assert lr_factor(0, 10, 2, "cosine", 0.1) == pytest.approx(0.5)
    assert lr_factor(1, 10, 2, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(2, 10, 2, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(6, 10, 2, "cosine", 0.1) == pytest.approx(0.55)
    assert lr_factor(9, 10, 2, "cosine", 0.1) == pytest.approx(0.1 + 0.45 * (1 + math.cos(7 * math.pi / 8)))
    assert lr_factor(6, 10, 2, "linear", 0.1) == pytest.approx(0.55)
    assert lr_factor(9, 10, 2, "linear", 0.1) == pytest.approx(1 - 0.9 * 7 / 8)
    assert lr_factor(9, 10, 0, "constant", 0.1) == 1.0


def test_logged_lr_follows_schedule(tmp_path):
    c = cfg(tmp_path, steps=6, warmup_steps=2, schedule="cosine", min_lr_ratio=0.2)
    _, res = run(c)
    df = pl.read_parquet(res.metrics_path)
    assert df["step"].to_list() == [1, 2, 3, 4, 5, 6]
    want = [c.lr * lr_factor(s - 1, 6, 2, "cosine", 0.2) for s in range(1, 7)]
    assert df["lr"].to_list() == pytest.approx(want)
    assert df["tokens"].to_list() == [4 * (T - 1) * s for s in range(1, 7)]
    assert df["loss"][-1] < df["loss"][0]


# ---- parameter groups and optimisers --------------------------------------------------------------
def test_param_groups_no_decay_for_biases_norms_and_lr_multiplier(tmp_path):
    model = make_model()
    c = cfg(tmp_path, lr_multipliers={r"^mlp\.": 3.0})
    groups = build_param_groups(model, c, "adamw")["adamw"]
    by_name = {n: g for g in groups for n in g["param_names"]}
    for n in ("norm.weight", "norm.bias", "mlp.bias"):
        assert by_name[n]["weight_decay"] == 0.0, n
    for n in ("embed.weight", "mlp.weight", "lm_head.weight"):
        assert by_name[n]["weight_decay"] == 0.1, n
    assert by_name["mlp.weight"]["base_lr"] == pytest.approx(3e-2)
    assert by_name["mlp.bias"]["base_lr"] == pytest.approx(3e-2)
    assert by_name["embed.weight"]["base_lr"] == pytest.approx(1e-2)
    with pytest.raises(HybridlabError, match="match no parameter"):
        build_param_groups(model, cfg(tmp_path, lr_multipliers={"attn": 2.0}), "adamw")
    with pytest.raises(HybridlabError, match="several"):
        build_param_groups(model, cfg(tmp_path, lr_multipliers={"mlp": 2.0, "weight": 2.0}), "adamw")


def test_no_decay_really_means_unchanged_by_decay(tmp_path):
    # A zero-gradient bias must not move under AdamW even with huge weight decay.
    model = make_model()
    c = cfg(tmp_path, weight_decay=10.0)
    opt = HybridOptimizer(model, c, "adamw")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    assert torch.equal(after["mlp.bias"], before["mlp.bias"])
    assert torch.equal(after["norm.weight"], before["norm.weight"])
    assert not torch.equal(after["mlp.weight"], before["mlp.weight"])  # decayed


def test_muon_only_for_hidden_2d_matrices(tmp_path):
    model = make_model()
    c = cfg(tmp_path, optimizer="muon", steps=3)
    opt = HybridOptimizer(model, c, "muon")
    assert isinstance(opt.optimizers["muon"], torch.optim.Muon)
    muon_names = {n for g in opt.optimizers["muon"].param_groups for n in g["param_names"]}
    adamw_names = {n for g in opt.optimizers["adamw"].param_groups for n in g["param_names"]}
    assert muon_names == {"mlp.weight"}  # embedding, head and 1-D params stay in AdamW
    assert adamw_names == {"embed.weight", "norm.weight", "norm.bias", "mlp.bias", "lm_head.weight"}
    seen = {}
    run(c, model=model, on_step_start=lambda s, m, o: seen.setdefault("opt", o))
    o = seen["opt"]
    assert "momentum_buffer" in o.state_for(model.mlp.weight)
    assert "exp_avg" in o.state_for(model.mlp.bias) and "exp_avg" in o.state_for(model.embed.weight)


def test_optimizer_switch_at_step_keeps_adamw_state(tmp_path):
    c = cfg(tmp_path, optimizer="adamw", optimizer_switch_step=3, optimizer_after_switch="muon", steps=6)
    seen = []
    model, _ = run(c, on_step_start=lambda s, m, o: seen.append(o))
    assert [o.kind for o in seen] == ["adamw"] * 3 + ["muon"] * 3
    final = seen[-1]
    # The bias stayed in AdamW through the switch, so its step count continued to 6 ...
    assert final.state_for(model.mlp.bias)["step"].item() == 6
    # ... while the hidden matrix moved to Muon (fresh momentum, no AdamW moments).
    assert set(final.state_for(model.mlp.weight)) == {"momentum_buffer"}


# ---- sampler ---------------------------------------------------------------------------------------
def test_sampler_epochs_and_resume():
    s = EpochSampler(5, seed=3)
    first = s.next_indices(7)
    p0, p1 = epoch_permutation(5, 3, 0).tolist(), epoch_permutation(5, 3, 1).tolist()
    assert first == p0 + p1[:2] and sorted(p0) == list(range(5)) and p0 != p1
    state = s.state_dict()
    rest = s.next_indices(6)
    s2 = EpochSampler(5, seed=3)
    s2.load_state_dict(state)
    assert s2.next_indices(6) == rest
    with pytest.raises(ValueError):
        EpochSampler(6, seed=3).load_state_dict(state)


# ---- determinism, resume, NaN --------------------------------------------------------------------
def test_two_runs_are_identical(tmp_path):
    m1, r1 = run(cfg(tmp_path, name="a"))
    m2, r2 = run(cfg(tmp_path, name="b"))
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), n
    assert det_metrics(r1.metrics_path).equals(det_metrics(r2.metrics_path))


class Kill(Exception):
    pass


def test_resume_after_kill_is_bitwise_identical(tmp_path):
    # Dropout (RNG), grad accumulation, eval, grad-norm groups and an AdamW->Muon switch all cross the kill.
    kw = dict(steps=9, ckpt_every=3, keep_last_k=2, eval_every=2, optimizer_switch_step=4,
              optimizer_after_switch="muon")
    groups = {"head": lambda n: n.startswith("lm_head"), "body": lambda n: not n.startswith("lm_head")}
    evalf = lambda m, s: {"w": m.lm_head.weight.sum(), "r": torch.rand(()).item()}
    ref_model, ref = run(cfg(tmp_path, name="ref", **kw), eval_fn=evalf, grad_norm_groups=groups)

    def killer(step, model, opt):
        if step == 7:
            raise Kill()

    c = cfg(tmp_path, name="killed", **kw)
    with pytest.raises(Kill):
        run(c, eval_fn=evalf, grad_norm_groups=groups, on_step_start=killer)
    assert [s for s, _ in list_checkpoints(tmp_path / "killed" / "checkpoints")] == [3, 6]
    assert pl.read_parquet(c.out_dir + "/metrics.parquet")["step"].max() == 7  # rows past the checkpoint
    model, res = run(c, model=make_model(seed=123), eval_fn=evalf, grad_norm_groups=groups)  # same command
    assert res.step == 9
    for (n, a), (_, b) in zip(ref_model.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), n
    got, want = det_metrics(res.metrics_path), det_metrics(ref.metrics_path)
    assert got.columns == want.columns and "eval/w" in got.columns and "grad_norm/head" in got.columns
    assert got.equals(want)
    # A finished run rerun is a no-op.
    _, again = run(c)
    assert again.step == 9


def test_eval_does_not_change_training_and_grad_groups_partition_norm(tmp_path):
    groups = {"head": lambda n: n.startswith("lm_head"), "rest": lambda n: not n.startswith("lm_head")}
    # The eval draws random numbers and runs the model in eval mode: neither may leak into training.
    evalf = lambda m, s: {"x": torch.randn(()).item() + m(torch.zeros(1, 3, dtype=torch.long)).sum().item()}
    m1, r1 = run(cfg(tmp_path, name="a", eval_every=2), eval_fn=evalf, grad_norm_groups=groups)
    m2, _ = run(cfg(tmp_path, name="b"))
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    df = pl.read_parquet(r1.metrics_path)
    assert df["eval/x"].is_null().to_list() == [s % 2 != 0 for s in df["step"].to_list()]
    tot = (df["grad_norm/head"] ** 2 + df["grad_norm/rest"] ** 2).sqrt()
    assert tot.to_list() == pytest.approx(df["grad_norm"].to_list(), rel=1e-5)


def test_eval_rows_only_at_eval_steps(tmp_path):
    c = cfg(tmp_path, steps=5, log_every=2, eval_every=3)
    _, res = run(c, eval_fn=lambda m, s: {"step_seen": s})
    df = pl.read_parquet(res.metrics_path)
    assert df["step"].to_list() == [2, 3, 4, 5]  # logs at 2, 4; eval at 3 and the last step
    assert df["eval/step_seen"].to_list() == [None, 3.0, None, 5.0]


def test_grad_accum_matches_bigger_micro_batch(tmp_path):
    _, a = run(cfg(tmp_path, name="a", micro_batch_size=4, grad_accum=1, grad_clip=None), model=make_model(dropout=0.0))
    _, b = run(cfg(tmp_path, name="b", micro_batch_size=2, grad_accum=2, grad_clip=None), model=make_model(dropout=0.0))
    la, lb = pl.read_parquet(a.metrics_path)["loss"], pl.read_parquet(b.metrics_path)["loss"]
    assert la.to_list() == pytest.approx(lb.to_list(), rel=1e-5)


def test_grad_norm_is_reported_before_clipping(tmp_path):
    _, res = run(cfg(tmp_path, steps=2, grad_clip=1e-3))
    assert (pl.read_parquet(res.metrics_path)["grad_norm"] > 1e-2).all()


def test_nan_loss_stops_naming_step_and_keeps_last_good_checkpoint(tmp_path):
    task = LMTask()
    task.nan_from_step = 5

    def count(step, model, opt):
        task.step = step

    c = cfg(tmp_path, steps=8, ckpt_every=2)
    model = make_model()
    with pytest.raises(HybridlabError, match=r"non-finite loss at step 6 .*step_000000004"):
        train(model, task, make_data(), c, on_step_start=count)
    assert [s for s, _ in list_checkpoints(tmp_path / "run" / "checkpoints")] == [2, 4]
    assert all(torch.isfinite(p).all() for p in model.parameters())  # stopped before the update
    # Fixing the cause and rerunning resumes from step 4 and finishes.
    task.nan_from_step = None
    _, res = run(c, task=task)
    assert res.step == 8


def test_task_without_num_tokens_is_rejected(tmp_path):
    class Bad:
        def loss(self, model, batch):
            return torch.zeros(()), {}

    with pytest.raises(HybridlabError, match="num_tokens"):
        train(make_model(), Bad(), make_data(), cfg(tmp_path))


def test_precision_auto_and_bf16_autocast(tmp_path):
    c = cfg(tmp_path, steps=2)
    assert c.resolved_precision("cpu") == "fp32" and c.resolved_precision("cuda") == "bf16"
    dtypes = []

    class Recording(LMTask):
        def loss(self, model, batch):
            dtypes.append(model(batch["input_ids"]).dtype)
            return super().loss(model, batch)

    run(c, task=Recording())
    run(cfg(tmp_path, name="bf16", steps=2, precision="bf16"), task=Recording())
    assert dtypes[:4] == [torch.float32] * 4 and dtypes[4:] == [torch.bfloat16] * 4


def test_rows_after_are_exactly_the_rows_the_sampler_has_not_reached():
    s = EpochSampler(10, seed=4)
    seen = s.next_indices(3) + s.next_indices(4)  # two updates of a stage
    rest = rows_after(10, 4, len(seen))
    assert sorted(seen + rest) == list(range(10)) and not set(seen) & set(rest)
    assert rest == s.next_indices(3)  # the same order the sampler would go on in
    assert rows_after(10, 4, 0) == epoch_permutation(10, 4, 0).tolist()
    assert rows_after(10, 4, 10) == [] and rows_after(10, 4, 25) == []  # a whole epoch: nothing unseen
    with pytest.raises(HybridlabError, match=">= 0"):
        rows_after(10, 4, -1)
