"""Two-stage distillation (hybridlab.train.distill) on tiny random models: losses vs hand references,
what trains and what stays frozen, and the held-out curve metrics."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_qwen3
from transformers import GraniteConfig, GraniteForCausalLM

from hybridlab.errors import HybridlabError
from hybridlab.eval.perplexity import token_kl
from hybridlab.models.convert import convert_to_hybrid
from hybridlab.train import distill
from hybridlab.train.config import TrainConfig
from hybridlab.train.loop import train
from hybridlab.train.tasks import heldout_ce_by_language

V, T = 64, 16


def _qwen(layers=3, seed=0):
    return tiny_qwen3(seed=seed, vocab_size=V, num_hidden_layers=layers, tie_word_embeddings=True,
                      max_position_embeddings=T).eval()


def _granite(seed=0):
    torch.manual_seed(seed)
    cfg = GraniteConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=True,
                        max_position_embeddings=T, logits_scaling=4.0, residual_multiplier=0.5,
                        embedding_multiplier=2.0, attention_multiplier=0.25)
    return GraniteForCausalLM(cfg).eval()


class Rows(torch.utils.data.Dataset):
    """A PackedDataset stand-in: int64 rows with one language each."""

    def __init__(self, n, langs=("eng_Latn", "fra_Latn"), seed=0):
        g = torch.Generator().manual_seed(seed)
        self.rows = torch.randint(0, V, (n, T), generator=g)
        self.langs = [langs[i % len(langs)] for i in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def _ids(b=2, seed=1):
    return torch.randint(0, V, (b, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("make", [_qwen, _granite])
def test_lm_head_side_reproduces_the_models_logits(make):
    model = make()
    ids = _ids()
    side = distill.lm_head_side(model, distill.final_hidden(model, ids))
    logits = (side.hidden @ side.weight.T + (0 if side.bias is None else side.bias)) * side.scale
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    torch.testing.assert_close(logits.detach(), ref, atol=1e-5, rtol=1e-5)
    assert side.weight is model.get_input_embeddings().weight  # tied: the head IS the embedding
    if isinstance(model, GraniteForCausalLM):
        assert side.scale == 0.25


def test_lm_head_side_refuses_softcapped_logits():
    model = _qwen()
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(HybridlabError, match="soft-caps"):
        distill.lm_head_side(model, torch.zeros(1, 2, 32))


def test_attention_capture_reads_what_the_layer_adds_to_the_residual():
    model = _qwen()
    ids = _ids()
    cap = distill.AttentionCapture(model, [1])
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
    layer = model.model.layers[1]
    with torch.no_grad():
        torch.testing.assert_close(cap.inputs[1], layer.input_layernorm(hs[1]))
        mid = hs[1] + cap.outputs[1]
        torch.testing.assert_close(mid + layer.mlp(layer.post_attention_layernorm(mid)), hs[2], atol=1e-5, rtol=1e-5)
    ours = [h.id for h in cap.handles]
    cap.remove()
    assert not cap.inputs and not set(ours) & set(model.model.layers[1].self_attn._forward_hooks)


def test_stage1_loss_matches_a_hand_computed_alignment():
    teacher = _qwen()
    student = convert_to_hybrid(teacher, [0], "gdn", seed=3)
    task = distill.Stage1Task(teacher, student, inputs="teacher")
    ids = _ids()
    loss, per_layer = task.loss(student, ids)
    # Hand reference: run every teacher layer by hand, feed each converted layer's normed input to its mixer.
    with torch.no_grad():
        hs = teacher(input_ids=ids, output_hidden_states=True).hidden_states
    ref = []
    for i in (1, 2):
        t_layer, s_attn = teacher.model.layers[i], student.model.layers[i].self_attn
        x = t_layer.input_layernorm(hs[i])
        pos = teacher.model.rotary_emb(x, torch.arange(T)[None])
        t_out = t_layer.self_attn(hidden_states=x, position_embeddings=pos, attention_mask=None)[0]
        s_out = s_attn.mixer(x)[0]
        ref.append(((s_out - t_out) ** 2).sum(-1).mean())
    ref_sum = torch.stack(ref).sum()  # summed over layers: each mixer's gradient is its own layer's term
    torch.testing.assert_close(loss, ref_sum, atol=1e-5, rtol=1e-4)
    assert set(per_layer) == {"align/1", "align/2"}
    torch.testing.assert_close(per_layer["align/2"], ref[1].detach(), atol=1e-5, rtol=1e-4)
    assert loss.item() > 1e-4  # a fresh mixer is not the attention
    task.close()


def test_stage1_student_inputs_agree_with_teacher_inputs_on_the_first_mixer_layer():
    # Layer 0 is full attention and identical in both models, so mixer layer 1 sees the same input either way.
    teacher = _qwen()
    student = convert_to_hybrid(teacher, [0], "gdn", seed=3)
    ids = _ids()
    by_teacher = distill.Stage1Task(teacher, student, inputs="teacher")
    s_t, t_t = by_teacher.layer_outputs(student, ids)
    by_teacher.close()
    by_student = distill.Stage1Task(teacher, student, inputs="student")
    s_s, t_s = by_student.layer_outputs(student, ids)
    by_student.close()
    torch.testing.assert_close(s_s[1], s_t[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(t_s[2], t_t[2])
    assert not torch.allclose(s_s[2], s_t[2], atol=1e-4)  # layer 2's inputs differ (student's mixer 1 vs attention)


def test_stage1_trains_only_the_mixers_and_lowers_the_alignment_loss(tmp_path):
    teacher = _qwen()
    teacher_before = copy.deepcopy(teacher.state_dict())
    student = convert_to_hybrid(teacher, [0], "gdn", seed=3)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    trainable = distill.freeze_all_but_mixers(student)
    assert trainable and all(".self_attn.mixer." in n for n in trainable)
    assert not any("layers.0." in n for n in trainable)  # the FA layer
    task = distill.Stage1Task(teacher, student)
    data = Rows(32)
    eval_ids = data.rows[:8]
    cfg = TrainConfig(out_dir=str(tmp_path), steps=12, micro_batch_size=4, lr=1e-2, warmup_steps=0,
                      schedule="constant", weight_decay=0.0, progress=False)
    start = task.heldout_alignment(student, eval_ids, batch_size=4)
    train(student, task, data, cfg)
    end = task.heldout_alignment(student, eval_ids, batch_size=4)
    assert end < 0.7 * start
    after = student.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".self_attn.mixer." in k for k in changed)
    assert all(torch.equal(teacher_before[k], v) for k, v in teacher.state_dict().items())
    task.close()


def test_a_student_assembled_from_the_shared_stage1_equals_its_own_teacher_forced_stage1(tmp_path):
    # One stage 1 with every layer converted, then a placement's converted student takes its mixers from it: the
    # same weights as that placement's own stage 1 on the same rows (summed loss, no global-norm clip, per-layer
    # mixer seeds), while a clipped run would couple the layers.
    teacher = _qwen(layers=4)
    data = Rows(24)

    def stage1(fa_layers, clip):
        student = convert_to_hybrid(teacher, fa_layers, "gdn", seed=5)
        distill.freeze_all_but_mixers(student)
        task = distill.Stage1Task(teacher, student)
        cfg = TrainConfig(out_dir=str(tmp_path / f"{fa_layers}{clip}"), steps=6, micro_batch_size=4, lr=3e-3,
                          warmup_steps=1, weight_decay=0.1, grad_clip=clip, progress=False, seed=7)
        train(student, task, data, cfg)
        task.close()
        return student

    shared = stage1([], None)
    own = stage1([0, 2], None)
    converted = convert_to_hybrid(teacher, [0, 2], "gdn", seed=5)
    fresh_shared = convert_to_hybrid(teacher, [], "gdn", seed=5)
    for i in (1, 3):  # conversion draws layer i's mixer alike whatever else is converted
        a, b = converted.model.layers[i].self_attn.state_dict(), fresh_shared.model.layers[i].self_attn.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert distill.assemble(converted, shared) == [1, 3]
    mine, ref = converted.state_dict(), own.state_dict()
    assert mine.keys() == ref.keys()
    moved = [k for k in ref if ".mixer." in k and not torch.equal(ref[k], fresh_shared.state_dict()[k])]
    assert moved  # stage 1 trained the mixers
    for k in ref:
        torch.testing.assert_close(mine[k], ref[k], atol=1e-6, rtol=1e-5, msg=k)
    # the FA layers stay the teacher's
    t = teacher.state_dict()
    assert all(torch.equal(mine[k], t[k]) for k in t if k.startswith(("model.layers.0.", "model.layers.2.")))
    # clipping the global norm couples the layers: the assembled student is then not the placement's own run
    clipped_shared, clipped_own = stage1([], 1e-3), stage1([0, 2], 1e-3)
    again = convert_to_hybrid(teacher, [0, 2], "gdn", seed=5)
    distill.assemble(again, clipped_shared)
    worst = max((again.state_dict()[k] - clipped_own.state_dict()[k]).abs().max().item() for k in moved)
    assert worst > 1e-4


def test_assemble_refuses_a_shared_stage1_of_another_structure():
    teacher = _qwen(layers=4)
    student = convert_to_hybrid(teacher, [0], "gdn", seed=5)
    with pytest.raises(HybridlabError, match="no mixer at layers"):
        distill.assemble(student, convert_to_hybrid(teacher, [1], "gdn", seed=5))
    with pytest.raises(HybridlabError, match="hybrid"):
        distill.assemble(student, convert_to_hybrid(teacher, [], "gla", seed=5))
    with pytest.raises(HybridlabError, match="mixer config differs"):
        distill.assemble(student, convert_to_hybrid(teacher, [], "gdn", seed=5, conv_init="identity"))


@pytest.mark.parametrize("make", [_qwen, _granite])
def test_stage2_loss_and_gradient_equal_full_logit_kl(make):
    teacher = make(seed=0)
    student = make(seed=5).train()
    ids = _ids()
    task = distill.Stage2Task(teacher, chunk_tokens=5, vocab_chunk=24)
    loss, _ = task.loss(student, ids)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}
    student.zero_grad(set_to_none=True)
    # Reference: full logits, KL at every position (token_kl drops the last one, so append a dummy).
    with torch.no_grad():
        t_logits = teacher(input_ids=ids).logits
    s_logits = student(input_ids=ids).logits
    pad = torch.zeros(2, 1, V)
    ref = token_kl(torch.cat([t_logits, pad], 1), torch.cat([s_logits, pad], 1)).mean()
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-5)
    ref.backward()
    for n, p in student.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, atol=1e-6, rtol=1e-4, msg=n)
    assert all(not p.requires_grad for p in teacher.parameters())


def test_stage2_training_lowers_heldout_kl_and_leaves_the_teacher_alone(tmp_path):
    teacher = _qwen()
    teacher_before = copy.deepcopy(teacher.state_dict())
    student = convert_to_hybrid(teacher, [0], "gdn", seed=3)
    data = Rows(32)
    ids, langs = distill.heldout_rows(Rows(8, seed=9), 4)
    start = distill.heldout_curve_metrics(student, teacher, ids, langs)
    cfg = TrainConfig(out_dir=str(tmp_path), steps=10, micro_batch_size=4, lr=3e-3, warmup_steps=0,
                      schedule="constant", weight_decay=0.0, eval_every=5, progress=False)
    calls = []

    def eval_fn(model, step):
        calls.append(step)
        return distill.heldout_curve_metrics(model, teacher, ids, langs)

    train(student, distill.Stage2Task(teacher, chunk_tokens=16), data, cfg, eval_fn=eval_fn,
          grad_norm_groups=distill.grad_norm_groups())
    end = distill.heldout_curve_metrics(student, teacher, ids, langs)
    assert calls == [5, 10]
    assert end["kl"] < 0.8 * start["kl"]
    assert all(torch.equal(teacher_before[k], v) for k, v in teacher.state_dict().items())


def test_heldout_rows_takes_the_first_rows_of_each_language():
    data = Rows(7, langs=("a", "a", "b"))  # langs a a b a a b a
    ids, langs = distill.heldout_rows(data, 2)
    assert langs == ["a", "a", "b", "b"]
    assert torch.equal(ids, data.rows[[0, 1, 2, 5]])
    assert len(distill.heldout_rows(data, None)[1]) == 7
    with pytest.raises(HybridlabError):
        distill.heldout_rows(data, 0)


def test_heldout_curve_metrics_ce_matches_heldout_ce_and_kl_to_itself_is_zero():
    teacher = _qwen()
    student = copy.deepcopy(teacher)
    data = Rows(6, langs=("eng_Latn", "fra_Latn", "fra_Latn"))
    ids, langs = distill.heldout_rows(data, 3)
    got = distill.heldout_curve_metrics(student, teacher, ids, langs, batch_size=4)
    ref = heldout_ce_by_language(student, data, max_rows_per_language=3)
    for key in ("ce", "ce/eng_Latn", "ce/fra_Latn"):
        assert got[key] == pytest.approx(ref[key], rel=1e-6)
    assert abs(got["kl"]) < 1e-6 and abs(got["kl/fra_Latn"]) < 1e-6
    # pooled = token-weighted: 2 English and 3 French rows (the first 3 of 4) of equal length.
    assert langs == ["eng_Latn", "fra_Latn", "fra_Latn", "eng_Latn", "fra_Latn"]
    assert got["ce"] == pytest.approx((2 * got["ce/eng_Latn"] + 3 * got["ce/fra_Latn"]) / 5, rel=1e-6)


def test_eval_interval_steps_rounds_tokens_to_updates():
    assert distill.eval_interval_steps(1000, 2, 1, 64) == 8  # 1000 / 128 = 7.8
    assert distill.eval_interval_steps(10, 2, 1, 64) == 1
    assert distill.eval_interval_steps(4096, 2, 4, 64) == 8
    with pytest.raises(HybridlabError):
        distill.eval_interval_steps(0, 2, 1, 64)


def test_grad_norm_groups_split_mixers_attention_and_the_rest():
    groups = distill.grad_norm_groups()
    names = {"model.layers.1.self_attn.mixer.q_proj.weight": "mixer",
             "model.layers.0.self_attn.q_proj.weight": "attention",
             "model.layers.0.mlp.up_proj.weight": "other", "model.embed_tokens.weight": "other"}
    for name, group in names.items():
        assert [g for g, pred in groups.items() if pred(name)] == [group], name


def test_stage1_refuses_a_dense_student_and_unknown_inputs():
    teacher = _qwen()
    with pytest.raises(HybridlabError, match="not a hybridlab hybrid"):
        distill.Stage1Task(teacher, _qwen(seed=1))
    student = convert_to_hybrid(teacher, [0], "gdn")
    with pytest.raises(HybridlabError, match="stage-1 inputs"):
        distill.Stage1Task(teacher, student, inputs="both")
    with pytest.raises(HybridlabError, match="layers"):
        distill.Stage1Task(_qwen(layers=4), student)


def test_stage2_gradients_are_unchanged_by_gradient_checkpointing():
    teacher = _qwen()
    ids = _ids()
    students = [convert_to_hybrid(teacher, [0], "gdn", seed=3).train() for _ in range(2)]
    students[1].activation_checkpointing_enable()
    assert students[1].model.layers[1].gradient_checkpointing
    grads = []
    for student in students:
        loss, _ = distill.Stage2Task(teacher, chunk_tokens=7).loss(student, ids)
        loss.backward()
        grads.append({n: p.grad for n, p in student.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=1e-6, rtol=1e-5, msg=n)


def _curve_frame(ce, kl):
    import polars as pl

    return pl.DataFrame({"step": [0, 1, 2, 3], "tokens": [0, 5, 10, 20],
                         "eval/ce": [ce[0], None, ce[1], ce[2]], "eval/kl": [kl[0], None, kl[1], kl[2]],
                         "eval/ce/fra_Latn": [ce[0], None, ce[1], ce[2]], "loss": [None, 1.0, 1.0, 1.0]})


def test_tokens_to_baseline_against_hand_interpolation():
    curves = {"base": _curve_frame([5.0, 4.0, 3.0], [1.0, 0.5, 0.2]),
              "fast": _curve_frame([5.0, 3.5, 2.5], [1.0, 0.1, 0.05]),
              "slow": _curve_frame([5.0, 4.5, 4.0], [0.2, 0.3, 0.4])}
    out = distill.tokens_to_baseline(curves, "base")
    get = {(r["placement"], r["metric"], r["lang"]): r for r in out.iter_rows(named=True)}
    assert len(out) == 3 * 3  # placements x (ce all, ce fra, kl all)
    fast = get[("fast", "ce", "all")]
    # target 3.0 (base final); fast crosses between (10, 3.5) and (20, 2.5): 10 + 0.5 / 1.0 * 10 = 15.
    assert fast["target"] == 3.0 and fast["tokens"] == pytest.approx(15.0) and fast["baseline_tokens"] == 20.0
    assert fast["fraction"] == pytest.approx(0.75) and fast["final"] == 2.5
    assert get[("base", "ce", "all")]["fraction"] == 1.0
    assert get[("slow", "ce", "all")]["tokens"] is None and get[("slow", "ce", "all")]["fraction"] is None
    assert get[("fast", "ce", "fra_Latn")]["fraction"] == pytest.approx(0.75)
    # kl: target 0.2; fast: 0 + (1.0 - 0.2) / 0.9 * 10 tokens; slow is there at its first point (0 tokens).
    assert get[("fast", "kl", "all")]["tokens"] == pytest.approx(8.0 / 0.9)
    assert get[("slow", "kl", "all")]["tokens"] == 0.0 and get[("slow", "kl", "all")]["fraction"] == 0.0
    with pytest.raises(HybridlabError, match="baseline placement"):
        distill.tokens_to_baseline(curves, "sandwich")


def test_with_overall_pools_languages_by_tokens():
    import polars as pl

    from hybridlab.train.heldout import ROW_SCHEMA

    t = pl.DataFrame([{"model": "m", "lang": "a", "n_tokens": 10, "ce": 1.0, "ppl": 2.718, "kl": 0.1},
                      {"model": "m", "lang": "b", "n_tokens": 30, "ce": 2.0, "ppl": 7.389, "kl": 0.5}],
                     schema=ROW_SCHEMA)
    row = distill.with_overall(t).row(-1, named=True)
    assert row["lang"] == "all" and row["n_tokens"] == 40
    assert row["ce"] == pytest.approx(1.75) and row["ppl"] == pytest.approx(math.exp(1.75))
    assert row["kl"] == pytest.approx(0.4)
    no_kl = distill.with_overall(t.with_columns(kl=pl.lit(None, pl.Float64))).row(-1, named=True)
    assert no_kl["kl"] is None


@pytest.mark.parametrize("change, message", [
    ({"kl_chunk_tokens": 0}, "presets.tiny.train.distill.kl_chunk_tokens = 0 is out of range"),
    ({"stage1_inputs": "both"}, "stage1_inputs = 'both' is not allowed (allowed: teacher, student)"),
    ({"stage1": {"micro_batch_size": 8, "lr": 1e-3}}, "presets.tiny.train.distill.stage1: "),
    ({"eval_every": 5}, "unknown key 'presets.tiny.train.distill.eval_every'"),
])
def test_bad_distill_config_values_give_one_line_errors(change, message):
    import yaml
    from smoke import ROOT

    from hybridlab.config import expand_presets, validate

    config = expand_presets(yaml.safe_load((ROOT / "config.yaml").read_text()))
    config["presets"]["tiny"]["train"]["distill"].update(change)
    with pytest.raises(HybridlabError) as err:
        validate(config)
    assert message in str(err.value) and "\n" not in str(err.value)
