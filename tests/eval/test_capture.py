import pytest
import torch
from torch import nn
from transformers import (
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    PreTrainedTokenizerFast,
)
from tiny_models import tiny_qwen3

from hybridlab.errors import HybridlabError
from hybridlab.eval.capture import capture_hidden_states
from hybridlab.models.sites import find_mixer_sites

SMALL = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)


def _qwen3(n_layers=3):
    return tiny_qwen3(seed=0, num_hidden_layers=n_layers, head_dim=16, **SMALL).eval()


def _sentences(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 128, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _record(module_list, attr, scale=1.0, post=None):
    """Hook `attr` of every layer and record its output (optionally post-processed) per call."""
    seen, handles = {}, []
    for i, layer in enumerate(module_list):
        def hook(_m, _a, out, i=i):
            out = out[0] if isinstance(out, tuple) else out
            seen[i] = (post(i, out) if post else out) * scale
        handles.append(getattr(layer, attr).register_forward_hook(hook))
    return seen, handles


def _check_residual_decomposition(model, layers, mlp_attr, scale=1.0, mlp_post=None, sent=None):
    """h[l+1] - h[l] == attn_delta[l] + mlp contribution, for every decoder layer but the last (final norm)."""
    sent = sent or [[5, 9, 3, 7, 1, 2]]
    res = capture_hidden_states(model, None, sent)
    mlp_seen, handles = _record(layers, mlp_attr, scale, mlp_post)
    with torch.no_grad():
        model(input_ids=torch.tensor(sent))
    for h in handles:
        h.remove()
    for layer in range(len(layers) - 1):
        lhs = res.hidden[layer + 1] - res.hidden[layer]
        rhs = res.attn_delta[layer] + mlp_seen[layer][0]
        torch.testing.assert_close(lhs, rhs, atol=1e-5, rtol=1e-5)
        assert res.attn_delta[layer].abs().max() > 1e-3  # non-trivial contribution
    return res


def test_padding_removed_order_kept_and_matches_unbatched_runs():
    model = _qwen3()
    sents = _sentences(7)
    res = capture_hidden_states(model, None, sents, batch_size=3)
    assert res.n_sentences == 7 and res.n_layers == 3
    assert sorted(res.hidden) == [0, 1, 2, 3] and sorted(res.attn_delta) == [0, 1, 2]
    assert res.offsets.tolist() == [0] + torch.tensor([len(s) for s in sents]).cumsum(0).tolist()
    assert res.token_ids.tolist() == [t for s in sents for t in s]
    for i, s in enumerate(sents):
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([s]), output_hidden_states=True).hidden_states
        for layer in range(4):
            got = res.sets("hidden", layer)[i]
            assert got.dtype == torch.float32 and got.device.type == "cpu"
            torch.testing.assert_close(got, ref[layer][0], atol=1e-5, rtol=1e-4)


def test_layer_selection_and_negative_indices():
    model = _qwen3()
    res = capture_hidden_states(model, None, _sentences(3), layers=[0, -1], delta_layers=[1], batch_size=2)
    assert sorted(res.hidden) == [0, 3] and sorted(res.attn_delta) == [1]
    none = capture_hidden_states(model, None, _sentences(3), layers=[], with_attn_delta=False)
    assert none.hidden == {} and none.attn_delta == {}
    with pytest.raises(HybridlabError, match="not captured"):
        res.flat("hidden", 2)
    with pytest.raises(HybridlabError, match="out of range"):
        capture_hidden_states(model, None, _sentences(2), layers=[4])


def test_dense_attn_delta_is_the_attention_residual_contribution():
    model = _qwen3()
    assert [s.mixer_name for s in find_mixer_sites(model)] == ["self_attn"] * 3
    _check_residual_decomposition(model, model.model.layers, "mlp")


def test_native_hybrid_mamba_layers_with_residual_multiplier():
    torch.manual_seed(0)
    cfg = GraniteMoeHybridConfig(num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
                                 mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
                                 mamba_expand=1, mamba_chunk_size=8, num_local_experts=0,
                                 shared_intermediate_size=128, residual_multiplier=0.5, **SMALL)
    model = GraniteMoeHybridForCausalLM(cfg).eval()
    sites = find_mixer_sites(model)
    assert [(s.mixer_name, s.scale) for s in sites] == [("mamba", 0.5), ("self_attn", 0.5), ("mamba", 0.5)]
    _check_residual_decomposition(model, model.model.layers, "shared_mlp", scale=0.5)


def test_post_norm_layers_capture_the_normalised_mixer_output():
    torch.manual_seed(0)
    model = Olmo3ForCausalLM(Olmo3Config(num_hidden_layers=3, **SMALL)).eval()
    with torch.no_grad():  # non-trivial norm weights so hooking the wrong module would fail
        for layer in model.model.layers:
            layer.post_attention_layernorm.weight.uniform_(0.5, 2.0)
            layer.post_feedforward_layernorm.weight.uniform_(0.5, 2.0)
    assert {s.hooked for s in find_mixer_sites(model)} == {"post_attention_layernorm"}
    layers = model.model.layers
    _check_residual_decomposition(model, layers, "mlp",
                                  mlp_post=lambda i, out: layers[i].post_feedforward_layernorm(out))


class _CumMeanMixer(nn.Module):
    """Stand-in for a converted recurrent mixer: causal running mean of a projection, returns (out, None)."""

    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, hidden_states, **kwargs):
        v = self.proj(hidden_states)
        steps = torch.arange(1, v.shape[1] + 1, device=v.device).view(1, -1, 1)
        return v.cumsum(1) / steps, None


def test_converted_hybrid_wrapper_in_self_attn_is_captured():
    model = _qwen3()
    model.model.layers[0].self_attn = _CumMeanMixer(64)
    sents = [[4, 8, 15, 16], [23, 42, 7]]
    res = _check_residual_decomposition(model, model.model.layers, "mlp", sent=[sents[0]])
    res = capture_hidden_states(model, None, sents, batch_size=2)
    for i, s in enumerate(sents):
        with torch.no_grad():
            h0 = model.model.layers[0].input_layernorm(model.model.embed_tokens(torch.tensor([s])))
            expected = model.model.layers[0].self_attn(h0)[0][0]
        torch.testing.assert_close(res.sets("attn_delta", 0)[i], expected, atol=1e-6, rtol=1e-5)


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "<bos>": 1, "<unk>": 2} | {w: i + 3 for i, w in enumerate("a b c d e f".split())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>")


def test_tokenizer_path_drops_special_tokens_but_runs_them_through_the_model():
    model, tok = _qwen3(), _word_tokenizer()
    res = capture_hidden_states(model, tok, ["a b c", "d e"], batch_size=2)
    assert res.offsets.tolist() == [0, 3, 5]
    assert res.token_ids.tolist() == [3, 4, 5, 6, 7]
    with torch.no_grad():  # the BOS is part of the model input, only its row is dropped
        ref = model(input_ids=torch.tensor([[1, 3, 4, 5]]), output_hidden_states=True).hidden_states[2][0, 1:]
    torch.testing.assert_close(res.sets("hidden", 2)[0], ref, atol=1e-5, rtol=1e-4)
    kept = capture_hidden_states(model, tok, ["a b c"], keep_special_tokens=True)
    assert kept.token_ids.tolist() == [1, 3, 4, 5]
    with pytest.raises(HybridlabError, match="tokenizer is None"):
        capture_hidden_states(model, None, ["a b"])
    with pytest.raises(HybridlabError, match="no \\(non-special\\) tokens"):
        capture_hidden_states(model, tok, ["a", ""])


def test_model_without_token_mixer_is_a_clear_error():
    model = _qwen3()
    with pytest.raises(HybridlabError, match="no token mixer"):
        find_mixer_sites(model, mixer_names=["does_not_exist"])
