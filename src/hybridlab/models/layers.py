"""Where a model keeps its decoder layers: the one finder every module uses.

`find_decoder_layers(model)` returns the `nn.ModuleList` of decoder blocks of a transformers causal LM
(`model.get_decoder().layers`), of a bare decoder (`model.layers`), or None for a module without one
(toy models in tests). Callers that require layers raise their own one-line error on None.
"""

from __future__ import annotations

from torch import nn


def find_decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None
