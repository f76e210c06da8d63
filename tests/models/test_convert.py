"""Conversion of dense transformers LMs into hybrids: inheritance, exactness, generation, padding, save/load.

Tiny random teachers from local configs (Qwen3, Llama, Granite, OLMo-3); no hub.
"""

import copy
import json

import pytest
import torch
from transformers import (
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hybridlab.errors import HybridlabError
from hybridlab.models.cache import MixerCacheLayer
from hybridlab.models.convert import MixerAttention, convert_to_hybrid, hybrid_spec
from hybridlab.models.io import load_hybrid, save_hybrid

VOCAB, HIDDEN, HEADS, KV, HEAD_DIM, LAYERS = 128, 64, 4, 2, 16, 3
COMMON = dict(
    vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
    num_attention_heads=HEADS, num_key_value_heads=KV, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)


def _teacher(arch: str, **extra):
    torch.manual_seed(1)
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=HEAD_DIM, tie_word_embeddings=True, **extra))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**COMMON, head_dim=HEAD_DIM, attention_bias=True, **extra))
    elif arch == "granite":
        cfg = GraniteConfig(
            **COMMON, attention_multiplier=1 / HEAD_DIM, residual_multiplier=0.5, embedding_multiplier=2.0,
            logits_scaling=4.0, **extra,
        )
        model = GraniteForCausalLM(cfg)
    elif arch == "olmo3":
        cfg = Olmo3Config(
            **COMMON, sliding_window=4, layer_types=["sliding_attention", "sliding_attention", "full_attention"], **extra
        )
        model = Olmo3ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # non-trivial q/k norm gains so folding is visible
        for layer in model.model.layers:
            for name in ("q_norm", "k_norm"):
                if hasattr(layer.self_attn, name):
                    getattr(layer.self_attn, name).weight.uniform_(0.5, 1.5)
    return model.eval()


ARCHS = ("qwen3", "llama", "granite", "olmo3")


def _ids(batch=2, length=11, seed=0):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _greedy_by_full_forwards(model, ids, steps):
    seq = ids
    for _ in range(steps):
        nxt = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


@pytest.mark.parametrize("arch", ARCHS)
def test_all_fa_conversion_reproduces_teacher_exactly(arch):
    teacher = _teacher(arch)
    hybrid = convert_to_hybrid(teacher, list(range(LAYERS)), "gdn")
    ids = _ids()
    assert torch.equal(hybrid(ids).logits, teacher(ids).logits)
    assert not any(isinstance(m, MixerAttention) for m in hybrid.modules())


@pytest.mark.parametrize("arch", ("qwen3", "llama"))
def test_inherited_weights_equal_teacher(arch):
    teacher = _teacher(arch)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    hybrid = convert_to_hybrid(teacher, [2], "gdn", qk_norm="drop")
    n_rep = HEADS // KV
    for idx in (0, 1):
        attn, mixer = teacher.model.layers[idx].self_attn, hybrid.model.layers[idx].self_attn.mixer
        assert torch.equal(mixer.q_proj.weight, attn.q_proj.weight)
        assert torch.equal(mixer.o_proj.weight, attn.o_proj.weight)
        for h in range(HEADS):  # query head h reads KV head h // n_rep
            rows = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
            kv_rows = slice((h // n_rep) * HEAD_DIM, (h // n_rep + 1) * HEAD_DIM)
            assert torch.equal(mixer.k_proj.weight[rows], attn.k_proj.weight[kv_rows])
            assert torch.equal(mixer.v_proj.weight[rows], attn.v_proj.weight[kv_rows])
            if arch == "llama":
                assert torch.equal(mixer.k_proj.bias[rows], attn.k_proj.bias[kv_rows])
        if arch == "llama":
            assert torch.equal(mixer.q_proj.bias, attn.q_proj.bias) and torch.equal(mixer.o_proj.bias, attn.o_proj.bias)
    assert type(hybrid.model.layers[2].self_attn) is type(teacher.model.layers[2].self_attn)
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())  # teacher untouched


def _l2(x):
    return x / x.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("arch", ("qwen3", "olmo3"))
def test_folded_qk_norm_gives_teacher_directions(arch):
    teacher = _teacher(arch)
    hybrid = convert_to_hybrid(teacher, [2], "gdn", qk_norm="fold")
    attn, mixer = teacher.model.layers[0].self_attn, hybrid.model.layers[0].self_attn.mixer
    x = torch.randn(5, HIDDEN)
    with torch.no_grad():
        if arch == "qwen3":  # RMSNorm per head
            q_t = attn.q_norm(attn.q_proj(x).view(5, HEADS, HEAD_DIM))
            k_t = attn.k_norm(attn.k_proj(x).view(5, KV, HEAD_DIM))
        else:  # RMSNorm over the whole projection
            q_t = attn.q_norm(attn.q_proj(x)).view(5, HEADS, HEAD_DIM)
            k_t = attn.k_norm(attn.k_proj(x)).view(5, KV, HEAD_DIM)
        q_m = mixer.q_proj(x).view(5, HEADS, HEAD_DIM)
        k_m = mixer.k_proj(x).view(5, HEADS, HEAD_DIM)
    torch.testing.assert_close(_l2(q_m), _l2(q_t), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_l2(k_m), _l2(k_t).repeat_interleave(HEADS // KV, dim=1), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_l2(q_m), _l2(attn.q_proj(x).view(5, HEADS, HEAD_DIM)), atol=1e-3)  # the gain matters


@pytest.mark.parametrize(
    "arch, fa, kind",
    [("qwen3", [1], "gdn"), ("llama", [2], "gdn"), ("granite", [0], "gdn"), ("olmo3", [2], "gdn"), ("qwen3", [], "gdn"),
     ("qwen3", [1], "kda"), ("llama", [0], "gla")],
)
def test_generate_equals_manual_greedy_loop(arch, fa, kind):
    hybrid = convert_to_hybrid(_teacher(arch), fa, kind)
    ids = _ids(batch=2, length=7)
    out = hybrid.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, _greedy_by_full_forwards(hybrid, ids, 6))


def test_cached_step_logits_match_full_forward_and_cache_layout():
    hybrid = convert_to_hybrid(_teacher("qwen3"), [1], "gdn")
    ids = _ids(batch=2, length=12)
    full = hybrid(ids, use_cache=False).logits
    cache = DynamicCache(config=hybrid.config)
    out = hybrid(ids[:, :8], cache=cache, use_cache=True)
    steps = [out.logits]
    for t in range(8, 12):
        steps.append(hybrid(ids[:, t : t + 1], cache=out.cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    assert [type(layer).__name__ for layer in out.cache.layers] == ["MixerCacheLayer", "DynamicLayer", "MixerCacheLayer"]
    assert out.cache.get_seq_length() == 12  # layer 0 is a mixer: it counts tokens too
    assert isinstance(out.cache.layers[0], MixerCacheLayer) and out.cache.layers[0].state is not None


def test_left_padded_batch_generates_like_unpadded_prompts():
    hybrid = convert_to_hybrid(_teacher("llama"), [1], "gdn")
    long, short = _ids(1, 9, seed=3)[0], _ids(1, 5, seed=4)[0]
    pad = 0
    ids = torch.stack([long, torch.cat([torch.full((4,), pad), short])])
    mask = torch.tensor([[1] * 9, [0] * 4 + [1] * 5])
    batched = hybrid.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=pad)
    alone_long = hybrid.generate(long[None], max_new_tokens=5, do_sample=False, pad_token_id=pad)
    alone_short = hybrid.generate(short[None], max_new_tokens=5, do_sample=False, pad_token_id=pad)
    assert torch.equal(batched[0, 9:], alone_long[0, 9:])
    assert torch.equal(batched[1, 9:], alone_short[0, 5:])


def test_right_padding_leaves_real_token_logits_unchanged():
    hybrid = convert_to_hybrid(_teacher("qwen3"), [2], "gdn")
    ids = _ids(2, 10)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    padded = hybrid(ids, attention_mask=mask).logits
    torch.testing.assert_close(padded[0], hybrid(ids[:1]).logits[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(padded[1, :6], hybrid(ids[1:, :6]).logits[0], atol=1e-5, rtol=1e-4)
    assert hybrid.model.layers[0].self_attn.padding.mask_BS is None  # cleared after the forward
    copied = copy.deepcopy(hybrid)  # hooks and mixers must keep sharing one padding context in the copy
    assert copied.model.layers[0].self_attn.padding is copied.model.layers[1].self_attn.padding
    assert copied.model.layers[0].self_attn.padding is not hybrid.model.layers[0].self_attn.padding
    assert torch.equal(copied(ids, attention_mask=mask).logits, padded)


def test_hidden_states_attentions_and_hooks():
    hybrid = convert_to_hybrid(_teacher("qwen3"), [1], "kda")
    hybrid.config._attn_implementation = "eager"
    ids = _ids(1, 6)
    seen = []
    handle = hybrid.model.layers[0].self_attn.mixer.register_forward_hook(lambda m, a, o: seen.append(o[0].shape))
    out = hybrid(ids, output_hidden_states=True, output_attentions=True)
    handle.remove()
    assert len(out.hidden_states) == LAYERS + 1 and seen == [torch.Size([1, 6, HIDDEN])]
    assert len(out.attentions) == 1 and out.attentions[0].shape == (1, HEADS, 6, 6)  # the one FA layer
    # a hook on self_attn sees (y, None) and can patch the mixer output like an attention output
    handle = hybrid.model.layers[0].self_attn.register_forward_hook(lambda m, a, o: (torch.zeros_like(o[0]), o[1]))
    patched = hybrid(ids).logits
    handle.remove()
    assert not torch.allclose(patched, out.logits)


def test_beam_search_with_and_without_cache_agree():
    hybrid = convert_to_hybrid(_teacher("qwen3"), [1], "gdn")
    ids = _ids(2, 6)
    kw = dict(max_new_tokens=4, do_sample=False, num_beams=3, pad_token_id=0)
    assert torch.equal(hybrid.generate(ids, use_cache=True, **kw), hybrid.generate(ids, use_cache=False, **kw))


@pytest.mark.parametrize("kind", ("gdn", "kda", "gla"))
def test_save_load_roundtrip_is_exact(tmp_path, kind):
    hybrid = convert_to_hybrid(_teacher("qwen3"), [0, 2], kind, seed=3)
    save_hybrid(hybrid, tmp_path / "h")
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == [
        "config.json", "generation_config.json", "hybrid.json", "model.safetensors"
    ]
    spec = json.loads((tmp_path / "h" / "hybrid.json").read_text())
    assert spec["fa_layers"] == [0, 2] and spec["mixer_kind"] == kind and spec["hybridlab_version"]
    assert spec["layer_types"] == ["full_attention", kind, "full_attention"]
    loaded = load_hybrid(tmp_path / "h")
    ids = _ids(2, 9)
    assert torch.equal(loaded(ids).logits, hybrid.eval()(ids).logits)
    assert hybrid_spec(loaded).mixer_config == hybrid_spec(hybrid).mixer_config
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()  # tie kept


def test_a_hybrid_saved_again_is_byte_identical(tmp_path):
    """The tied-weight names safetensors adds to the metadata are written in hash order, which changes between
    saves; save_hybrid sorts them, so every save of the same model has the same bytes (and hybrid.json the
    same checksum)."""
    hybrid = convert_to_hybrid(_teacher("qwen3"), [1], "gdn", seed=3)
    saved = [(save_hybrid(hybrid, tmp_path / str(i)) / "model.safetensors").read_bytes() for i in range(8)]
    assert b'"model.embed_tokens.weight":"lm_head.weight"' in saved[0][:400]  # a second metadata key exists
    assert all(b == saved[0] for b in saved)
    ids = _ids(2, 5)
    assert torch.equal(load_hybrid(tmp_path / "7")(ids).logits, hybrid.eval()(ids).logits)


def test_a_skeleton_has_the_hybrids_parameters_on_meta_and_its_real_buffers(tmp_path):
    """What sharded ranks other than 0 pass to the training engine: no weights read, nothing allocated."""
    from hybridlab.train.fsdp import params_on_meta

    hybrid = convert_to_hybrid(_teacher("qwen3"), [0, 2], "gdn", seed=3)
    save_hybrid(hybrid, tmp_path / "h")
    (tmp_path / "h" / "model.safetensors").write_bytes(b"not read")
    with params_on_meta():
        skeleton = load_hybrid(tmp_path / "h", dtype=torch.float32, weights=False)
    assert {p.device.type for p in skeleton.parameters()} == {"meta"}
    assert {(n, p.shape) for n, p in skeleton.named_parameters()} == {(n, p.shape) for n, p in hybrid.named_parameters()}
    buffers = dict(hybrid.named_buffers())
    assert buffers and all(torch.equal(b, buffers[n]) for n, b in skeleton.named_buffers())
    assert skeleton.lm_head.weight is skeleton.model.embed_tokens.weight  # the tie, on meta
    assert next(torch.nn.Linear(2, 2).parameters()).device.type == "cpu"  # the patch ends with the block


def test_load_rejects_corrupt_and_incompatible_directories(tmp_path):
    hybrid = convert_to_hybrid(_teacher("qwen3"), [1], "gdn")
    good = save_hybrid(hybrid, tmp_path / "good")
    other = save_hybrid(convert_to_hybrid(_teacher("qwen3"), [0], "gdn"), tmp_path / "other")

    def variant(name, edit):
        d = tmp_path / name
        d.mkdir()
        for f in good.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        edit(d)
        return d

    cases = {
        "missing": variant("missing", lambda d: (d / "model.safetensors").unlink()),
        "badjson": variant("badjson", lambda d: (d / "hybrid.json").write_text("{not json")),
        "truncated": variant("truncated", lambda d: (d / "model.safetensors").write_bytes(
            (good / "model.safetensors").read_bytes()[:200])),
        "layers": variant("layers", lambda d: (d / "hybrid.json").write_text(
            (good / "hybrid.json").read_text().replace('"num_layers": 3', '"num_layers": 5'))),
        "mismatch": variant("mismatch", lambda d: (d / "model.safetensors").write_bytes(
            (other / "model.safetensors").read_bytes())),
        "format": variant("format", lambda d: (d / "hybrid.json").write_text('{"format": "something-else"}')),
    }
    for name, directory in cases.items():
        with pytest.raises(HybridlabError) as info:
            load_hybrid(directory)
        assert "\n" not in str(info.value), name
    with pytest.raises(HybridlabError, match="does not exist"):
        load_hybrid(tmp_path / "nowhere")


def test_unsupported_architecture_and_bad_arguments():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB))
    with pytest.raises(HybridlabError, match="GPT2LMHeadModel.*Qwen3ForCausalLM"):
        convert_to_hybrid(gpt2, [0], "gdn")
    teacher = _teacher("qwen3")
    with pytest.raises(HybridlabError, match="out of range"):
        convert_to_hybrid(teacher, [3], "gdn")
    with pytest.raises(HybridlabError, match="unknown"):
        convert_to_hybrid(teacher, [0], "gdn", mixer_overrides={"not_a_field": 1})
    with pytest.raises(HybridlabError, match="teacher-determined"):
        convert_to_hybrid(teacher, [0], "gdn", mixer_overrides={"head_k_dim": 8})
    with pytest.raises(HybridlabError, match="qk_norm"):
        convert_to_hybrid(teacher, [0], "gdn", qk_norm="keep")
    hybrid = convert_to_hybrid(teacher, [0], "gdn", mixer_overrides={"conv_size": 2})
    assert hybrid_spec(hybrid).mixer_config["conv_size"] == 2
    with pytest.raises(HybridlabError, match="already a hybrid"):
        convert_to_hybrid(hybrid, [0], "gdn")
    with pytest.raises(HybridlabError, match="not a hybridlab hybrid"):
        hybrid_spec(teacher)


def test_seeded_initialisation():
    teacher = _teacher("qwen3")
    a = convert_to_hybrid(teacher, [1], "gdn", seed=5).state_dict()
    b = convert_to_hybrid(teacher, [1], "gdn", seed=5).state_dict()
    c = convert_to_hybrid(teacher, [1], "gdn", seed=6).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    new = [k for k in a if ".mixer." in k and not k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))]
    assert new and any(not torch.equal(a[k], c[k]) for k in new)


@pytest.mark.parametrize("arch", ("qwen3", "llama"))
def test_inplace_conversion_equals_the_copy_and_keeps_the_teachers_attention_bit_identical(arch):
    """inplace=True (the conversion job's path: no second copy of the teacher) gives the very same tensors
    as converting a copy: the FA layers' weights are the teacher's bits, the mixers draw the same numbers."""
    teacher = _teacher(arch)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    copied = convert_to_hybrid(teacher, [0, 2], "gdn", seed=3).state_dict()
    model = _teacher(arch)
    inplace = convert_to_hybrid(model, [0, 2], "gdn", seed=3, inplace=True)
    assert inplace is model and isinstance(model.model.layers[1].self_attn, MixerAttention)
    got = inplace.state_dict()
    assert list(got) == list(copied) and all(torch.equal(got[k], copied[k]) for k in got)
    fa_keys = [k for k in before if k.startswith(("model.layers.0.", "model.layers.2."))]
    assert fa_keys and all(torch.equal(got[k], before[k]) for k in fa_keys)
    # the replaced attention is gone from the model, not kept beside its mixer
    assert not any(k.startswith("model.layers.1.self_attn.") and ".mixer." not in k for k in got)


def test_identity_conv_init_is_exactly_the_identity_before_silu():
    """conv_init="identity": each q/k/v short conv returns its input exactly (kernel (0, 0, 0, 1) with
    causal left padding), so the mixer's q/k/v are silu(teacher projections); prefill + cached steps
    and padded rows too. The default stays fla's random kernel."""
    import torch.nn.functional as F

    from hybridlab.models.mixers import MixerConfig, build_mixer

    teacher = _teacher("qwen3")
    ident = convert_to_hybrid(teacher, [1], "kda", seed=5, conv_init="identity")
    rand = convert_to_hybrid(teacher, [1], "kda", seed=5)
    assert hybrid_spec(ident).mixer_config["conv_init"] == "identity"
    assert hybrid_spec(rand).mixer_config["conv_init"] == "random"
    x = torch.randn(2, 7, HIDDEN, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1.0] * 7, [0.0, 0.0] + [1.0] * 5])  # second row left-padded
    for idx in (0, 2):
        mixer = ident.model.layers[idx].self_attn.mixer
        for name in ("q", "k", "v"):
            conv = getattr(mixer, f"{name}_conv1d")
            assert torch.equal(conv.weight[..., :-1], torch.zeros_like(conv.weight[..., :-1]))
            assert torch.equal(conv.weight[..., -1], torch.ones_like(conv.weight[..., -1]))
            proj = getattr(mixer, f"{name}_proj")(x)
            y, _ = conv(proj, None, None)
            assert torch.equal(y, F.silu(proj))
            y, _ = conv(proj, None, mask)
            assert torch.equal(y, F.silu(proj * mask[..., None]))
            y1, cache = conv(proj[:, :4], None, None)  # decoding continues from the conv state
            y2, _ = conv(proj[:, 4:], cache, None)
            assert torch.equal(torch.cat([y1, y2], 1), F.silu(proj))
        assert not torch.equal(rand.model.layers[idx].self_attn.mixer.q_conv1d.weight, mixer.q_conv1d.weight)
    # same parameter names (fla's) and shapes; every other parameter initialised identically (same RNG draws)
    a, b = ident.state_dict(), rand.state_dict()
    assert list(a) == list(b) and all(a[k].shape == b[k].shape for k in a)
    convs = [k for k in a if "_conv1d." in k]
    assert convs and all(k.endswith(("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")) for k in convs)
    assert all(torch.equal(a[k], b[k]) for k in a if k not in convs)
    # the same through mixer_overrides, and a standalone mixer
    over = convert_to_hybrid(teacher, [1], "kda", seed=5, mixer_overrides={"conv_init": "identity"}).state_dict()
    assert all(torch.equal(a[k], over[k]) for k in a)
    gdn = build_mixer(MixerConfig("gdn", 16, 2, 8, 8, conv_init="identity"), 0)
    assert torch.equal(gdn.v_conv1d.weight[..., -1], torch.ones(16, 1))


def test_identity_conv_init_survives_save_load_and_bad_values(tmp_path):
    teacher = _teacher("qwen3")
    hybrid = convert_to_hybrid(teacher, [0], "gdn", conv_init="identity")
    loaded = load_hybrid(save_hybrid(hybrid, tmp_path / "h"))
    assert hybrid_spec(loaded).mixer_config["conv_init"] == "identity"
    ids = _ids(2, 9)
    assert torch.equal(loaded(ids).logits, hybrid.eval()(ids).logits)
    with pytest.raises(HybridlabError, match="conv_init='zeros' is unknown"):
        convert_to_hybrid(teacher, [0], "gdn", conv_init="zeros")
    with pytest.raises(HybridlabError, match="give it once"):
        convert_to_hybrid(teacher, [0], "gdn", conv_init="identity", mixer_overrides={"conv_init": "random"})
