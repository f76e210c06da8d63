"""MixerConfig options of converted mixers: `output_gate` (gated or plain output RMSNorm) and `use_short_conv`,
through conversion (`mixer_overrides`) and save/load."""

import pytest
import torch

from hybridlab.errors import HybridlabError
from hybridlab.models.convert import convert_to_hybrid, hybrid_spec
from hybridlab.models.io import load_hybrid, save_hybrid
from hybridlab.models.mixers import MixerConfig, build_mixer
from tiny_models import tiny_qwen3

HIDDEN, HEADS, K, V = 32, 2, 8, 8
# fla's GatedDeltaNet parameter names (use_gate=True, short convs on) in named_parameters() order: the default
GDN_PARAMS = ["A_log", "dt_bias", "q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight",
              "k_conv1d.weight", "v_conv1d.weight", "o_proj.weight", "a_proj.weight", "b_proj.weight",
              "g_proj.weight", "o_norm.weight"]
NORM = {"gdn": "o_norm", "kda": "o_norm", "gla": "g_norm_swish_gate"}


def _mixer(kind, seed=0, **options):
    torch.manual_seed(seed)
    return build_mixer(MixerConfig(kind, HIDDEN, HEADS, K, V, chunk_size=8, **options), 0)


def _x(T=13):
    return torch.randn(2, T, HIDDEN, generator=torch.Generator().manual_seed(1))


def test_default_keeps_fla_parameter_names_and_gate():
    m = _mixer("gdn")
    assert m.cfg.output_gate is True and m.cfg.use_short_conv is True
    assert [n for n, _ in m.named_parameters()] == GDN_PARAMS
    for kind in ("kda", "gla"):
        names = [n for n, _ in _mixer(kind).named_parameters()]
        assert any(n.startswith("g_proj.") for n in names) and f"{NORM[kind]}.weight" in names


@pytest.mark.parametrize("kind", ["gdn", "kda", "gla"])
def test_output_gate_off_is_plain_rmsnorm_of_the_recurrence_output(kind):
    gated, plain = _mixer(kind), _mixer(kind, output_gate=False)
    names = [n for n, _ in plain.named_parameters()]
    assert plain.g_proj is None and not any("g_proj" in n for n in names)
    # only g_proj is gone; g_proj is drawn last, so every other parameter is initialised identically
    ref = gated.state_dict()
    assert names == [n for n, _ in gated.named_parameters() if not n.startswith("g_proj.")]
    assert all(torch.equal(p, ref[n]) for n, p in plain.state_dict().items())
    norm = getattr(plain, NORM[kind])
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)  # a non-trivial norm weight, so its use is visible
    captured = {}
    mix = plain.mix

    def capture(*args, **kwargs):
        o, state = mix(*args, **kwargs)
        captured["o"] = o
        return o, state

    plain.mix = capture
    x = _x()
    with torch.no_grad():
        y, _ = plain(x)
        o = captured["o"]  # the recurrence output [B, T, H, V]
        rms = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + plain.cfg.norm_eps) * norm.weight
        expected = plain.o_proj(rms.reshape(*x.shape[:2], HEADS * V))
    torch.testing.assert_close(y, expected, rtol=1e-6, atol=1e-7)
    # the gated default is not the same map (the gate changes the output)
    gated.load_state_dict({**ref, **plain.state_dict()})
    with torch.no_grad():
        assert not torch.allclose(gated(x)[0], y)


def test_output_gate_off_trains_and_decodes():
    m = _mixer("gdn", output_gate=False)
    x = _x(9)
    y, _ = m(x)
    y.square().sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    with torch.no_grad():
        full, _ = m(x)
        first, state = m(x[:, :5], use_cache=True)
        rest, _ = m(x[:, 5:], state=state, use_cache=True)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, rtol=1e-5, atol=1e-6)


def test_options_must_be_booleans():
    for name in ("use_short_conv", "output_gate"):
        with pytest.raises(HybridlabError, match=f"MixerConfig.{name} must be true or false"):
            MixerConfig("gdn", HIDDEN, HEADS, K, V, **{name: "no"})


@pytest.mark.parametrize("overrides", [{"use_short_conv": False}, {"output_gate": False},
                                       {"use_short_conv": False, "output_gate": False}])
def test_converted_options_survive_save_and_load(tmp_path, overrides):
    teacher = tiny_qwen3(seed=3).eval()
    hybrid = convert_to_hybrid(teacher, [1], "gdn", seed=2, mixer_overrides=overrides).eval()
    config = hybrid_spec(hybrid).mixer_config
    assert all(config[k] is v for k, v in overrides.items())
    names = [n for n, _ in hybrid.named_parameters()]
    assert any(".self_attn.mixer." in n for n in names)
    assert any("_conv1d." in n for n in names) == overrides.get("use_short_conv", True)
    assert any(".mixer.g_proj." in n for n in names) == overrides.get("output_gate", True)
    loaded = load_hybrid(save_hybrid(hybrid, tmp_path / "h"))
    assert hybrid_spec(loaded).mixer_config == config
    assert [n for n, _ in loaded.named_parameters()] == names
    ids = torch.randint(1, 64, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, hybrid(ids).logits)
