"""YaRN RoPE scaling of a loaded transformers model, for evaluation beyond its native window.

`apply_yarn(model, factor)` sets the text config's ``rope_parameters`` to YaRN (Peng et al. 2023) with
``factor`` and ``original_max_position_embeddings`` = the window the model was trained at, and rebuilds
the rotary-embedding module from it; the weights are untouched. Mixer layers have no RoPE, so a hybrid's
full-attention layers are the ones it changes. A model without a rotary-embedding module (NoPE) is left
as it is and the function returns None: there is nothing to scale.
"""

from __future__ import annotations

from torch import nn

from hybridlab.errors import HybridlabError


def apply_yarn(model: nn.Module, factor: float, original_max_position_embeddings: int | None = None) -> dict | None:
    """Switch ``model`` to YaRN RoPE in place; returns the new ``rope_parameters`` (None: no RoPE to scale)."""
    if not isinstance(factor, (int, float)) or factor <= 1:
        raise HybridlabError(f"YaRN factor must be a number > 1, got {factor!r}; use null for no scaling")
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    rotary = getattr(decoder, "rotary_emb", None)
    if rotary is None:
        return None
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    original = int(original_max_position_embeddings or config.max_position_embeddings)
    params = dict(getattr(config, "rope_parameters", None) or {})
    params.update(rope_type="yarn", factor=float(factor), original_max_position_embeddings=original)
    config.rope_parameters = params
    config.max_position_embeddings = int(original * factor)
    device = next(model.parameters()).device
    decoder.rotary_emb = type(rotary)(config=config).to(device)
    return params
