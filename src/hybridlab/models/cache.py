"""Per-layer cache slot for recurrent mixers inside a transformers ``Cache``.

transformers 5.x builds ``DynamicCache(config)`` itself (in ``generate`` and in the decoder's forward),
choosing each layer's cache class from ``config.layer_types``. A converted hybrid must keep the
teacher's ``layer_types`` (the decoder reads them to pick each layer's mask and RoPE), so every layer
starts with an attention slot. Each mixer therefore claims its own slot on first use: an empty
attention slot at its index is replaced by a :class:`MixerCacheLayer` holding the mixer's
``MixerState``. This keeps the cache a plain ``DynamicCache`` that generation utilities understand.

``MixerCacheLayer`` is a ``CacheLayerMixin`` (not a transformers ``LinearAttentionLayer``) because it
also counts the tokens it has seen: ``Cache.get_seq_length()`` (used for position ids) and
``get_mask_sizes`` must work even when layer 0 is a mixer or no layer is full attention. Its
``get_mask_sizes`` equals a ``DynamicLayer``'s, so a mask sized from it is the same mask.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from hybridlab.errors import HybridlabError


def map_state(state, fn):
    """Apply `fn` to every tensor in a MixerState-like dataclass (tensors, or tuples of tensors / None)."""

    def apply(value):
        if isinstance(value, torch.Tensor):
            return fn(value)
        if isinstance(value, tuple):
            return tuple(apply(v) for v in value)
        return value

    return dataclasses.replace(state, **{f.name: apply(getattr(state, f.name)) for f in dataclasses.fields(state)})


class MixerCacheLayer(CacheLayerMixin):
    """Holds one mixer's recurrent state and the number of tokens it has consumed."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, **kwargs):
        super().__init__()
        self.state = None
        self.seen_tokens = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        raise HybridlabError("a mixer cache layer holds recurrent state, not keys/values; do not call update() on it")

    def update(self, key_states, value_states, *args, **kwargs):
        raise HybridlabError("a mixer cache layer holds recurrent state, not keys/values; do not call update() on it")

    def update_state(self, state, num_new_tokens: int) -> None:
        self.state = state
        self.seen_tokens += num_new_tokens
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen_tokens + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.state = None
        self.seen_tokens = 0
        self.is_initialized = False

    def _map(self, fn) -> None:
        if self.state is not None:
            self.state = map_state(self.state, fn)

    def offload(self):
        self._map(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self):
        device = getattr(self, "device", None)
        if device is not None:
            self._map(lambda t: t.to(device, non_blocking=True))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices, ...])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise HybridlabError(
                "a recurrent mixer state cannot be rolled back; disable assisted/speculative decoding for hybrids"
            )


def mixer_cache_slot(cache: Cache, layer_idx: int) -> MixerCacheLayer:
    """The MixerCacheLayer at `layer_idx`, replacing the empty attention slot transformers created there."""
    layers = cache.layers
    while len(layers) <= layer_idx:  # lazily grown caches (DynamicCache() without a config)
        layers.append(DynamicLayer())
    slot = layers[layer_idx]
    if isinstance(slot, MixerCacheLayer):
        return slot
    if getattr(slot, "is_initialized", False) and getattr(slot, "keys", None) is not None and slot.get_seq_length() > 0:
        raise HybridlabError(
            f"cache layer {layer_idx} already holds attention keys/values but layer {layer_idx} is a recurrent mixer; "
            "pass a fresh cache (or none) to the hybrid model"
        )
    slot = MixerCacheLayer()
    layers[layer_idx] = slot
    return slot
