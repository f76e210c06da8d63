"""Where each decoder layer of any causal LM keeps its token mixer: `MixerSite`s and the decoder layer list.

- `find_decoder_layers(model, mixer_names)` returns `(name, ModuleList)` of the decoder layers: the
  `nn.ModuleList` of length `num_hidden_layers`; if several, the one named "...layers", then the one whose
  every layer has a token mixer; a one-line error when there is none. `decoder_layers_or_none(model)` is
  the same search returning the list alone, or None for a module without a config or without such a list
  (toy models in tests; FSDP wrapping and conversion raise their own error on None).
- `find_mixer_sites(model)`: one `MixerSite` per decoder layer. The mixer is found generically as the first
  present, non-None child among `MIXER_NAMES` (`self_attn` for dense layers and for converted hybrids whose
  wrapper replaces `self_attn`; `linear_attn` for Qwen3.5/Qwen3-Next/OLMo-Hybrid; `mamba` for
  Granite-4.0-H; `mixer`, ... for others). What the layer adds to the residual stream is read where the
  model family puts it:
  * post-norm / sandwich layers (a layer that has `post_feedforward_layernorm`: OLMo-2/3, the attention
    layers of OLMo-Hybrid, Gemma-2/3) add `post_attention_layernorm(mixer_out)`, so that norm is the
    hooked module;
  * Granite layers add `mixer_out * residual_multiplier`, so the site's `scale` is that multiplier.

Used by activation capture (`hybridlab.eval.capture`), BLD's layer sites (`hybridlab.train.bld`) and the
retrieval and recency analyses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from torch import nn

from hybridlab.errors import HybridlabError

MIXER_NAMES = ("self_attn", "linear_attn", "mamba", "mixer", "attention", "self_attention", "attn", "conv")


@dataclass(frozen=True)
class MixerSite:
    """Where decoder layer `layer`'s residual contribution is read from."""

    layer: int
    mixer_name: str  # the token mixer child, e.g. "linear_attn"
    hooked: str  # the child whose output is captured ("post_attention_layernorm" for post-norm layers)
    scale: float  # residual multiplier applied to the captured output (1.0 unless Granite-style)


def find_decoder_layers(model: nn.Module, mixer_names: Sequence[str] = MIXER_NAMES) -> tuple[str, nn.ModuleList]:
    """(name, ModuleList) of the decoder layers: the ModuleList of length num_hidden_layers; if several,
    the one named "...layers", then the one whose every layer has a token mixer."""
    config = getattr(model, "config", None)
    if config is None:
        raise HybridlabError(f"{type(model).__name__} has no .config; pass a transformers causal LM")
    n_layers, found = _decoder_candidates(model, config, mixer_names)
    if len(found) != 1:
        raise HybridlabError(f"could not identify the decoder layers of {type(model).__name__} (candidates: "
                             f"{[n for n, _ in found]}); expected one ModuleList of num_hidden_layers="
                             f"{n_layers} layers with a token mixer named one of {tuple(mixer_names)}")
    return found[0]


def decoder_layers_or_none(model: nn.Module, mixer_names: Sequence[str] = MIXER_NAMES) -> nn.ModuleList | None:
    """The decoder layers `find_decoder_layers` finds, or None for a module without a config or without
    such a list; several equally good candidates still raise its one-line error."""
    config = getattr(model, "config", None)
    found = _decoder_candidates(model, config, mixer_names)[1] if config is not None else []
    if len(found) > 1:
        return find_decoder_layers(model, mixer_names)[1]  # raises the one-line error
    return found[0][1] if found else None


def _decoder_candidates(model: nn.Module, config, mixer_names: Sequence[str]) -> tuple[int | None, list]:
    """(num_hidden_layers, the candidate (name, ModuleList) pairs left by the rules) of the one search."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = getattr(text_config, "num_hidden_layers", None)
    found = [(name, mod) for name, mod in model.named_modules()
             if isinstance(mod, nn.ModuleList) and len(mod) == n_layers and len(mod) > 0]
    if len(found) > 1:
        found = [(name, mod) for name, mod in found if name.endswith("layers")] or found
    if len(found) > 1:
        found = [(name, mod) for name, mod in found
                 if all(_present_mixers(layer, mixer_names) for layer in mod)] or found
    return n_layers, found


def _present_mixers(layer: nn.Module, names: Sequence[str]) -> list[str]:
    return [n for n in names if isinstance(getattr(layer, n, None), nn.Module)]


def find_mixer_sites(model: nn.Module, mixer_names: Sequence[str] | None = None) -> list[MixerSite]:
    """One `MixerSite` per decoder layer (see the module docstring for the rules)."""
    names = tuple(mixer_names) if mixer_names is not None else MIXER_NAMES
    _, layers = find_decoder_layers(model, names)
    sites = []
    for i, layer in enumerate(layers):
        present = _present_mixers(layer, names)
        if not present:
            raise HybridlabError(f"decoder layer {i} ({type(layer).__name__}) has no token mixer named one of "
                                 f"{names}; pass mixer_names=[...] with its attribute name")
        if mixer_names is None and len(present) > 1:
            raise HybridlabError(f"decoder layer {i} has several token mixers {present} (a parallel hybrid?); "
                                 "pass mixer_names=[...] to choose which one to capture")
        hooked = present[0]
        if isinstance(getattr(layer, "post_feedforward_layernorm", None), nn.Module):
            if not isinstance(getattr(layer, "post_attention_layernorm", None), nn.Module):
                raise HybridlabError(f"decoder layer {i} is post-norm but has no post_attention_layernorm; "
                                     "its residual contribution cannot be located")
            hooked = "post_attention_layernorm"
        scale = float(getattr(layer, "residual_multiplier", 1.0))
        sites.append(MixerSite(layer=i, mixer_name=present[0], hooked=hooked, scale=scale))
    return sites
