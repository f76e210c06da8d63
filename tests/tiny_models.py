"""The tiny models the unit tests build: a Qwen3 decoder a few keyword arguments away from `TINY_QWEN3`, and
its converted hybrid. Weights come from torch's global generator: a test that needs the same weights twice
passes `seed`."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

# 2 layers, width 32, 2 query heads of 16 sharing 1 KV head, MLP 64, 64 tokens
TINY_QWEN3 = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16)


def tiny_qwen3_config(**shape) -> Qwen3Config:
    """`TINY_QWEN3` with `shape`'s keys replaced or added (any Qwen3Config field)."""
    return Qwen3Config(**{**TINY_QWEN3, **shape})


def tiny_qwen3(*, seed: int | None = None, attn_implementation: str | None = None, **shape) -> Qwen3ForCausalLM:
    """A fresh Qwen3ForCausalLM of `tiny_qwen3_config(**shape)`, in training mode as transformers builds it;
    `seed` seeds torch first; `attn_implementation` (e.g. "eager") is fixed at construction."""
    if seed is not None:
        torch.manual_seed(seed)
    config = tiny_qwen3_config(**shape)
    if attn_implementation is not None:
        return Qwen3ForCausalLM._from_config(config, attn_implementation=attn_implementation)
    return Qwen3ForCausalLM(config)


def tiny_hybrid(fa_layers=(1,), mixer: str = "gdn", *, seed: int = 0, **shape):
    """`tiny_qwen3(**shape)` in eval mode converted to a hybrid with full attention at `fa_layers` (the other
    layers' new mixer parameters drawn with `seed`)."""
    from hybridlab.models.convert import convert_to_hybrid

    return convert_to_hybrid(tiny_qwen3(**shape).eval(), list(fa_layers), mixer, seed=seed)
