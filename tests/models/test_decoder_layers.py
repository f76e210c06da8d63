"""The one decoder-layer search (`hybridlab.models.sites`): `find_decoder_layers` raises when there is no
decoder layer list, `decoder_layers_or_none` (FSDP wrapping, conversion, distillation) returns None."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from tiny_models import tiny_qwen3

from hybridlab.errors import HybridlabError
from hybridlab.models.sites import decoder_layers_or_none, find_decoder_layers

SMALL = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
             head_dim=16)


def test_both_find_the_decoder_list_of_a_causal_lm():
    torch.manual_seed(0)
    model = tiny_qwen3(num_hidden_layers=3, **SMALL)
    name, layers = find_decoder_layers(model)
    assert name == "model.layers" and layers is model.get_decoder().layers
    assert decoder_layers_or_none(model) is layers
    assert decoder_layers_or_none(model.get_decoder()) is layers  # a bare decoder too


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = nn.Linear(2, 2)


class _Toy(nn.Module):
    def __init__(self, config=None, n=2):
        super().__init__()
        if config is not None:
            self.config = config
        self.layers = nn.ModuleList(_Layer() for _ in range(n))


def test_a_module_without_decoder_layers_is_none_or_a_one_line_error():
    for toy in (_Toy(), _Toy(SimpleNamespace(num_hidden_layers=5)), nn.Linear(2, 2)):
        assert decoder_layers_or_none(toy) is None
        with pytest.raises(HybridlabError) as e:
            find_decoder_layers(toy)
        assert "\n" not in str(e.value)
    toy = _Toy(SimpleNamespace(num_hidden_layers=2))
    assert decoder_layers_or_none(toy) is toy.layers and find_decoder_layers(toy) == ("layers", toy.layers)


def test_two_equally_good_candidates_raise_in_both():
    toy = _Toy(SimpleNamespace(num_hidden_layers=2))
    toy.more_layers = nn.ModuleList(_Layer() for _ in range(2))
    with pytest.raises(HybridlabError, match="could not identify the decoder layers"):
        find_decoder_layers(toy)
    with pytest.raises(HybridlabError, match="could not identify the decoder layers"):
        decoder_layers_or_none(toy)
