"""BLD on natural language: NoPE hybrid, arms, freeze/optimiser schedule, data glue (lm-eval: test_lm_eval_tasks.py)."""

import numpy as np
import pytest
import torch

from hybridlab.data.packing import documents_from_stream
from hybridlab.errors import HybridlabError
from hybridlab.train import arms, bld_nl

SHAPE = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 16, "intermediate_size": 48}
PATTERN = ["full_attention", "mixer", "mixer", "mixer"]


def _model(mixer="kda", seed=0, **shape):
    return bld_nl.build_nope_hybrid({**SHAPE, **shape}, pattern=PATTERN, mixer=mixer, vocab_size=64,
                                    context_len=32, eos_id=0, seed=seed)


# ---- model ----------------------------------------------------------------------------------------------------


def _scramble_rotary(model):
    """Replace the rotary embedding's (cos, sin) by random tables: a layer that uses them changes its output."""
    def hook(module, args, out):
        g = torch.Generator().manual_seed(0)
        return tuple(torch.randn(t.shape, generator=g, dtype=t.dtype) for t in out)

    return model.model.rotary_emb.register_forward_hook(hook)


@pytest.mark.parametrize("mixer", ["kda", "gdn", "gla"])
def test_nope_hybrid_layout_and_position_invariance(mixer):
    model = _model(mixer, num_hidden_layers=8).eval()
    assert model.hybridlab_spec.layer_types == ["full_attention", mixer, mixer, mixer] * 2
    assert bld_nl.is_nope(model)
    ids = torch.randint(1, 64, (2, 20))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        shifted = model(input_ids=ids, position_ids=torch.arange(20)[None] + 137).logits
        handle = _scramble_rotary(model)
        scrambled = model(input_ids=ids).logits
        handle.remove()
    assert torch.allclose(ref, shifted, atol=1e-6)
    assert torch.equal(ref, scrambled)  # no layer reads the rotary tables at all


def test_same_model_with_rope_would_depend_on_positions():
    """The invariance test above can fail: re-enable RoPE in the attention layer and the tables matter."""
    model = _model("gdn").eval()
    model.model.layers[0].self_attn.use_rope = 1
    ids = torch.randint(1, 64, (2, 20))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        handle = _scramble_rotary(model)
        diff = model(input_ids=ids).logits - ref
        handle.remove()
    assert diff.abs().max() > 1e-3


def test_nope_survives_save_and_load(tmp_path):
    from hybridlab.models.registry import load_causal_lm

    model = _model("kda").eval()
    from hybridlab.models.io import save_hybrid

    save_hybrid(model, tmp_path / "m")
    loaded = load_causal_lm(tmp_path / "m")
    assert bld_nl.is_nope(loaded) and loaded.hybridlab_spec.layer_types == model.hybridlab_spec.layer_types
    ids = torch.randint(1, 64, (1, 12))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_build_is_seeded_and_chunk_size_only_changes_speed():
    a, b, c = _model(seed=3), _model(seed=3), _model(seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    d = _model(seed=3, mixer_chunk_size=8).eval()
    assert d.model.layers[1].self_attn.mixer.cfg.chunk_size == 8
    ids = torch.randint(1, 64, (1, 24))
    with torch.no_grad():
        assert torch.allclose(a.eval()(input_ids=ids).logits, d(input_ids=ids).logits, atol=1e-4)


def test_layer_kinds_and_bad_patterns():
    assert arms.layer_kinds(PATTERN, 8)[4] == "full_attention"
    with pytest.raises(HybridlabError, match="not a multiple"):
        arms.layer_kinds(PATTERN, 6)
    with pytest.raises(HybridlabError, match="at least one"):
        arms.layer_kinds(["mixer"], 4)
    run = {"sizes": {"s": dict(SHAPE, num_key_value_heads=3)}, "steps": 2}
    with pytest.raises(HybridlabError, match="sizes.s"):
        arms.check_study({"pattern": PATTERN}, run)
    with pytest.raises(HybridlabError, match="exactly one of steps and tokens_per_param"):
        arms.check_study({"pattern": PATTERN}, {"sizes": {"s": SHAPE}, "steps": 2, "tokens_per_param": 20})


def test_bad_bld_nl_config_values_are_one_line_errors():
    import copy
    from pathlib import Path

    import yaml

    from hybridlab import config

    base = config.expand_presets(yaml.safe_load((Path(__file__).resolve().parents[2] / "config.yaml").read_text()))
    for mutate, expected in [
        (lambda c: c["presets"]["tiny"]["train"]["bld_nl"].update(context_len=2), "context_len = 2 is out of range"),
        (lambda c: c["experiments"]["bld_nl"].update(freeze_scope="layer"), "allowed: mixer, block"),
        (lambda c: c["presets"]["smoke"]["eval"]["heads_position"]["retrieval_heads"].pop("recent"),
         "missing key 'recent'"),
    ]:
        c = copy.deepcopy(base)
        mutate(c)
        with pytest.raises(HybridlabError, match=expected) as info:
            config.validate(c)
        assert "\n" not in str(info.value)


# ---- arms and schedule -----------------------------------------------------------------------------------------


def test_arm_names_include_the_size_only_with_several_sizes():
    one = [a.name for a in arms.nl_arms(["kda", "gdn"], ["xs"])]
    assert one == ["kda-baseline", "kda-bld", "gdn-baseline", "gdn-bld"]
    two = arms.nl_arms(["kda"], ["180m", "1b"])
    assert [a.name for a in two] == ["kda-180m-baseline", "kda-180m-bld", "kda-1b-baseline", "kda-1b-bld"]
    assert (two[3].mixer, two[3].size, two[3].variant) == ("kda", "1b", "bld")


def test_total_steps_from_tokens_per_param_by_hand():
    run = {"tokens_per_param": 20, "micro_batch_size": 2, "grad_accum": 4, "context_len": 100}
    assert bld_nl.total_steps(run, 1000) == 25  # 20 * 1000 / (2 * 4 * 100)
    assert bld_nl.total_steps(run, 1001) == 26  # ceil
    assert bld_nl.total_steps({"steps": 7}, 10**9) == 7


def test_freeze_phase_is_a_tenth_of_the_unfrozen_phase():
    model = _model()
    arm = arms.NLArm("kda-bld", "kda", "xs", "bld")
    plan = bld_nl.plan_arm(model, arm, 110, freeze_fraction=0.1, scope="block", optimizer_after_unfreeze="muon")
    assert plan.windows == [(0, 10)]  # 10 frozen / 100 unfrozen updates
    assert plan.optimizer_switch_step == 10 and plan.optimizer_after_switch == "muon"
    assert plan.frozen_names and all(n.startswith(("model.layers.1.", "model.layers.2.", "model.layers.3."))
                                     for n in plan.frozen_names)
    assert any(".mlp." in n for n in plan.frozen_names)  # block scope: the whole recurrent layer
    base = bld_nl.plan_arm(model, arms.NLArm("kda-baseline", "kda", "xs", "baseline"), 110, freeze_fraction=0.1,
                           scope="mixer", optimizer_after_unfreeze="muon")
    assert base.windows == [] and base.schedules == []
    assert base.optimizer_switch_step == 10  # same optimiser schedule as the BLD arm
    with pytest.raises(HybridlabError, match="leaves nothing"):
        bld_nl.plan_arm(model, arm, 1, freeze_fraction=0.5, scope="block", optimizer_after_unfreeze="muon")


def test_short_bld_run_freezes_recurrent_blocks_then_switches_to_muon(tmp_path):
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train
    from hybridlab.train.tasks import CausalLMTask

    data = [torch.randint(1, 64, (32,)) for _ in range(16)]
    results = {}
    for variant in ("baseline", "bld"):
        model = _model("gdn", seed=1)
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        arm = arms.NLArm(f"gdn-{variant}", "gdn", "xs", variant)
        plan = bld_nl.plan_arm(model, arm, 11, freeze_fraction=0.1, scope="block", optimizer_after_unfreeze="muon")
        assert plan.optimizer_switch_step == 1
        kinds = []
        snapshots = {}

        def spy(step, m, opt, kinds=kinds, snapshots=snapshots):
            kinds.append(opt.kind)
            if step == 1:
                snapshots.update({n: p.detach().clone() for n, p in m.named_parameters()})

        run = {"micro_batch_size": 4, "lr": 1e-2, "warmup_fraction": 0.0, "eval_every": 100}
        cfg = TrainConfig.from_dict(bld_nl.train_config_dict(run, out_dir=str(tmp_path / variant), seed=0, steps=3,
                                                             plan=plan) | {"progress": False})
        train(model, CausalLMTask(), data, cfg, on_step_start=plan.schedules + [spy], restart=True)
        assert kinds == ["adamw", "muon", "muon"]
        mixer = "model.layers.2.self_attn.mixer.q_proj.weight"
        attn = "model.layers.0.self_attn.q_proj.weight"
        results[variant] = (torch.equal(snapshots[mixer], start[mixer]), torch.equal(snapshots[attn], start[attn]))
        assert not torch.equal(dict(model.named_parameters())[mixer], start[mixer])  # unfrozen later: it trains
    assert results["bld"] == (True, False)  # after update 0: recurrent block untouched, attention trained
    assert results["baseline"] == (False, False)


# ---- data glue --------------------------------------------------------------------------------------------------


class _Rows:
    def __init__(self, n, seq_len):
        self.data = [torch.arange(i * seq_len, (i + 1) * seq_len) for i in range(n)]
        self.langs = ["eng_Latn"] * n

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def test_joined_rows_concatenate_consecutive_rows():
    joined = bld_nl.JoinedRows(_Rows(7, 4), 3)
    assert len(joined) == 2 and joined.langs == ["eng_Latn", "eng_Latn"]
    assert torch.equal(joined[1], torch.arange(12, 24))
    assert bld_nl.rows_per_sequence(256, 64) == 4
    with pytest.raises(HybridlabError, match="multiple"):
        bld_nl.rows_per_sequence(100, 64)


def test_documents_from_stream_by_hand():
    stream = np.array([5, 6, 7, 0, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 0, 3])
    docs = documents_from_stream(stream, eos_id=0)
    assert [d.tolist() for d in docs] == [[5, 6, 7], [8, 9], [1, 2, 3, 4, 5, 6, 7], [3]]

