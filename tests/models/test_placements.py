"""Placements: the documented examples, hand-derived 40/10 and 12/3 indices, uneven blocks, errors."""

import pytest

from hybridlab.errors import HybridlabError
from hybridlab.models.placements import (
    PLACEMENTS,
    fa_layers,
    layer_types,
    num_fa_layers,
    placement_diagram,
)

EXPECTED = {
    # DESIGN.md, verbatim
    (36, 0.25): {
        "standard_periodic": [3, 7, 11, 15, 19, 23, 27, 31, 35],
        "reverse_periodic": [0, 4, 8, 12, 16, 20, 24, 28, 32],
        "sandwich": [0, 1, 2, 3, 4, 32, 33, 34, 35],
        "interleaved_sandwich": [0, 2, 4, 6, 8, 29, 31, 33, 35],
        "endpoint_spread": [0, 4, 9, 13, 18, 22, 26, 31, 35],
    },
    # by hand: blocks of 4; linspace(0, 39, 10) = 0, 4.33, 8.67, 13, 17.33, 21.67, 26, 30.33, 34.67, 39
    (40, 0.25): {
        "standard_periodic": [3, 7, 11, 15, 19, 23, 27, 31, 35, 39],
        "reverse_periodic": [0, 4, 8, 12, 16, 20, 24, 28, 32, 36],
        "sandwich": [0, 1, 2, 3, 4, 35, 36, 37, 38, 39],
        "interleaved_sandwich": [0, 2, 4, 6, 8, 31, 33, 35, 37, 39],
        "endpoint_spread": [0, 4, 9, 13, 17, 22, 26, 30, 35, 39],
    },
    # by hand: blocks of 4; linspace(0, 11, 3) = 0, 5.5 (half up -> 6), 11
    (12, 0.25): {
        "standard_periodic": [3, 7, 11],
        "reverse_periodic": [0, 4, 8],
        "sandwich": [0, 1, 11],
        "interleaved_sandwich": [0, 2, 11],
        "endpoint_spread": [0, 6, 11],
    },
    # the smoke teacher (4 layers, one FA layer): every scheme but standard_periodic gives layer 0, which is
    # why the smoke preset distils only standard_periodic and sandwich (config.yaml)
    (4, 0.25): {
        "standard_periodic": [3],
        "reverse_periodic": [0],
        "sandwich": [0],
        "interleaved_sandwich": [0],
        "endpoint_spread": [0],
    },
}


@pytest.mark.parametrize("key", list(EXPECTED))
@pytest.mark.parametrize("scheme", PLACEMENTS)
def test_named_schemes_match_definitions(key, scheme):
    num_layers, ratio = key
    assert fa_layers(scheme, num_layers, ratio) == EXPECTED[key][scheme]


def test_uneven_blocks_use_rounded_boundaries():
    # 10 layers, n = 3: boundaries round(0, 3.33, 6.67, 10) = 0, 3, 7, 10 -> blocks of 3, 4, 3
    assert fa_layers("reverse_periodic", 10, 0.3) == [0, 3, 7]
    assert fa_layers("standard_periodic", 10, 0.3) == [2, 6, 9]
    # 13 layers, ratio 0.25 -> 3.25 -> n = 3: boundaries 0, 4, 9, 13
    assert fa_layers("standard_periodic", 13, 0.25) == [3, 8, 12]


def test_round_half_up_for_layer_count():
    assert num_fa_layers(20, 0.125) == 3  # 2.5 -> 3 (banker's rounding would give 2)
    assert num_fa_layers(10, 0.1) == 1  # no float drift: 10 * 0.1 is exactly 1
    assert num_fa_layers(36, 0.25) == 9


def test_all_layers_fa_when_ratio_one():
    for scheme in ("standard_periodic", "reverse_periodic", "sandwich", "endpoint_spread"):
        assert fa_layers(scheme, 6, 1.0) == list(range(6))


def test_single_fa_layer():
    assert fa_layers("standard_periodic", 8, 0.125) == [7]
    assert fa_layers("reverse_periodic", 8, 0.125) == [0]
    assert fa_layers("sandwich", 8, 0.125) == [0]
    assert fa_layers("interleaved_sandwich", 8, 0.125) == [0]
    assert fa_layers("endpoint_spread", 8, 0.125) == [0]


def test_explicit_indices_sorted_and_validated():
    assert fa_layers("explicit", 6, indices=[5, 0, 2]) == [0, 2, 5]
    assert fa_layers("explicit", 6, indices=[]) == []
    with pytest.raises(HybridlabError, match="out of range"):
        fa_layers("explicit", 6, indices=[0, 6])
    with pytest.raises(HybridlabError, match="repeated"):
        fa_layers("explicit", 6, indices=[1, 1])
    with pytest.raises(HybridlabError, match="needs `indices`"):
        fa_layers("explicit", 6)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("sandwich", 12), {"ratio": 0.01}, "rounds to 0"),
        (("sandwich", 12), {"ratio": 1.5}, "outside"),
        (("sandwich", 12), {"ratio": 0.0}, "outside"),
        (("sandwich", 12), {}, "needs `ratio`"),
        (("sandwich", 12), {"ratio": 0.25, "indices": [0]}, "not `indices`"),
        (("zigzag", 12), {"ratio": 0.25}, "standard_periodic, reverse_periodic"),
        (("interleaved_sandwich", 12), {"ratio": 0.75}, "at most 7"),
        (("sandwich", 0), {"ratio": 0.25}, "positive integer"),
    ],
)
def test_impossible_requests_raise(args, kwargs, match):
    with pytest.raises(HybridlabError, match=match):
        fa_layers(*args, **kwargs)


def test_layer_types_and_diagram():
    types = layer_types("standard_periodic", 8, 0.25, mixer_kind="kda")
    assert types == ["kda"] * 3 + ["full_attention"] + ["kda"] * 3 + ["full_attention"]
    assert placement_diagram(types) == "...A...A"
    assert placement_diagram(["full_attention", "sliding_attention", "gdn"]) == "AS."
