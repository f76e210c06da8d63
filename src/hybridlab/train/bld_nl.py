"""BLD on natural language: the NoPE Attention-Mixer-Mixer-Mixer hybrid, its arms and training glue.

Follows the competing-learning / Better Layer Division study's natural-language setting: a hybrid whose
layers repeat `pattern` (default full attention, then three recurrent mixers, i.e. KDA:attention 3:1),
no positional encoding anywhere, pre-trained from scratch on English text, once as a baseline and once
with the recurrent blocks frozen at the start (BLD); the same with GDN and GLA in place of KDA, and at
several sizes for a scaling curve.

Definitions (this project's):

- **Model.** A SmolLM3 decoder (the Llama architecture: RMSNorm, SwiGLU, GQA attention, no q/k norm)
  with `no_rope_layers = [0] * L`: SmolLM3 applies rotary embeddings only in layers flagged 1, so every
  attention layer gets none (exactly the identity rotation cos=1, sin=0). The flag lives in
  `config.json`, so every loader (`load_hybrid`, `load_causal_lm`, lm-eval's HFLM) rebuilds a NoPE model;
  outputs do not depend on `position_ids` (tested). Layer i is full attention iff
  `pattern[i % len(pattern)] == "full_attention"`; `num_hidden_layers` must be a multiple of the
  pattern length. The other layers' attention is replaced by the mixer with `convert_to_hybrid`
  (they keep the q/k/v/o of the random attention init, as in the Spaced Retrieval study), so the
  model is a regular hybrid (`save_hybrid` / `load_hybrid`). Initialisation is seeded and identical
  for the baseline and BLD arms of one (mixer, size).
- **Arms.** For each size and mixer: `baseline` and `bld`. Names: `<mixer>-<variant>` with one size,
  `<mixer>-<size>-<variant>` with several.
- **Schedule.** Both arms train the same N updates with the same data order and lr schedule. The
  freeze phase is `freeze_fraction` of the unfrozen phase, F / (N - F) = freeze_fraction, i.e. the BLD
  arm freezes the recurrent layers on updates [0, F) with F = round_half_up(N * f / (1 + f))
  (`hybridlab.train.bld.windows_to_steps`). Scope `block` freezes whole recurrent decoder layers
  (mixer, norms, MLP), `mixer` only the token mixer. Both arms use AdamW on [0, F) and
  `optimizer_after_unfreeze` (Muon for hidden matrices + AdamW for the rest, `hybridlab.train.optim`)
  from update F on, so the only difference between the arms is the freeze.
- **Length.** `steps`, or `tokens_per_param` (the paper's ~20 tokens per parameter): N =
  ceil(tokens_per_param * parameters / (micro_batch_size * grad_accum * context_len)), parameters
  counted once (tied embeddings once).
- **Context.** `context_len` is a multiple k of the packed mixture's `seq_len`; a training sequence is
  k consecutive packed rows. Packing is contiguous and shuffles only whole blocks of rows
  (`hybridlab.data.packing`, `block_rows` a multiple of k), so a training sequence is one stretch of
  text in which a long document stays whole, with EOS between documents.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.train.arms import FULL_ATTENTION, VARIANTS, NLArm, layer_kinds
from hybridlab.train.config import tokens_per_update

SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size")
# Optional in a size: the mixers' chunk length (speed only; the chunked ops' outputs do not depend on it).
CHUNK_KEY = "mixer_chunk_size"


def nope_config(shape: dict, *, vocab_size: int, context_len: int, eos_id: int):
    """SmolLM3Config with rotary embeddings disabled in every layer (see the module docstring)."""
    from transformers import SmolLM3Config

    missing = sorted(set(SHAPE_KEYS) - set(shape))
    extra = sorted(set(shape) - set(SHAPE_KEYS))
    if missing or extra:
        raise HybridlabError(f"bld_nl model shape: missing {missing}, unknown {extra}; give exactly {list(SHAPE_KEYS)}")
    n = shape["num_hidden_layers"]
    return SmolLM3Config(vocab_size=vocab_size, max_position_embeddings=context_len, tie_word_embeddings=True,
                         bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                         no_rope_layers=[0] * n, use_sliding_window=False, **shape)


def is_nope(model: nn.Module) -> bool:
    """True iff no layer of a SmolLM3-style model applies rotary embeddings."""
    flags = getattr(model.config, "no_rope_layers", None)
    return flags is not None and not any(flags)


def build_nope_hybrid(shape: dict, *, pattern: Sequence[str], mixer: str, vocab_size: int, context_len: int,
                      eos_id: int, seed: int) -> nn.Module:
    """The seeded NoPE hybrid of one (size, mixer); identical for the baseline and BLD arms."""
    from transformers import SmolLM3ForCausalLM

    from hybridlab.models.convert import convert_to_hybrid

    shape = dict(shape)
    overrides = {"chunk_size": shape.pop(CHUNK_KEY)} if CHUNK_KEY in shape else None
    config = nope_config(shape, vocab_size=vocab_size, context_len=context_len, eos_id=eos_id)
    kinds = layer_kinds(pattern, config.num_hidden_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dense = SmolLM3ForCausalLM(config)
    fa = [i for i, k in enumerate(kinds) if k == FULL_ATTENTION]
    model = convert_to_hybrid(dense, fa, mixer, mixer_overrides=overrides, seed=seed, inplace=True)
    model.hybridlab_spec.extra = {"study": "bld_nl", "pattern": list(pattern), "nope": True}
    return model


def count_parameters(model: nn.Module) -> int:
    """Parameters counted once (tied embedding / LM head once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def total_steps(run: dict, n_params: int) -> int:
    """N from `steps`, or from `tokens_per_param` (see the module docstring)."""
    if ("steps" in run) == ("tokens_per_param" in run):
        raise HybridlabError("train.bld_nl: set exactly one of steps and tokens_per_param")
    if "steps" in run:
        return int(run["steps"])
    per_step = tokens_per_update(run["micro_batch_size"], run.get("grad_accum", 1), run["context_len"])
    return max(1, math.ceil(run["tokens_per_param"] * n_params / per_step))


def bld_nl_need_tokens(sizes: dict, run: dict, experiment: dict, vocab_size: int) -> dict[str, int]:
    """Tokens each BLD-NL (size, mixer) consumes: updates x sequences per update x context_len.

    Parameters are counted exactly as training counts them (`count_parameters`, tied embedding once), on
    models built on the meta device (no memory, ~0.1 s each). The data phase sizes the streamed English
    mixture with it.
    """
    per_step = tokens_per_update(run["micro_batch_size"], run.get("grad_accum", 1), run["context_len"])
    need = {}
    for size, shape in sizes.items():
        for mixer in experiment["mixers"]:
            with torch.device("meta"):
                model = build_nope_hybrid(shape, pattern=experiment["pattern"], mixer=mixer,
                                          vocab_size=vocab_size, context_len=run["context_len"], eos_id=0,
                                          seed=0)
            need[f"{mixer}-{size}"] = total_steps(run, count_parameters(model)) * per_step
    return need


def freeze_window(freeze_fraction: float) -> tuple[float, float]:
    """BLD's frozen start as a fraction of all updates: F / N = f / (1 + f) so that F / (N - F) = f."""
    if not 0 < freeze_fraction < 1:
        raise HybridlabError(f"freeze_fraction={freeze_fraction} must be in (0, 1) (frozen / unfrozen updates)")
    return (0.0, freeze_fraction / (1.0 + freeze_fraction))


def plan_arm(model: nn.Module, arm: NLArm, steps: int, *, freeze_fraction: float, scope: str,
             optimizer_after_unfreeze: str):
    """The `BLDPlan` of one arm: BLD freezes [0, F); both arms switch optimiser at F."""
    from hybridlab.train.bld import FreezeArm, plan_bld, windows_to_steps

    if arm.variant not in VARIANTS:
        raise HybridlabError(f"bld_nl arm {arm.name!r} has variant {arm.variant!r}; use one of {VARIANTS}")
    window = freeze_window(freeze_fraction)
    switch = windows_to_steps([window], steps)[0][1]
    if switch >= steps:
        raise HybridlabError(f"bld_nl: the freeze phase ({switch} updates) leaves nothing of the {steps} updates "
                             "unfrozen; train longer or lower freeze_fraction")
    windows = (window,) if arm.variant == "bld" else ()
    recipe = FreezeArm(arm.name, windows, scope, optimizer_after_unfreeze)
    return plan_bld(model, recipe, steps, switch_step=switch)


def train_config_dict(run: dict, *, out_dir: str, seed: int, steps: int, plan) -> dict:
    """`TrainConfig` fields of one arm (warmup as a fraction of N; the optimiser switch from the plan)."""
    warmup = int(round(run.get("warmup_fraction", 0.0) * steps))
    cfg = {"out_dir": out_dir, "seed": seed, "steps": steps, "micro_batch_size": run["micro_batch_size"],
           "grad_accum": run.get("grad_accum", 1), "lr": run["lr"], "warmup_steps": min(warmup, steps),
           "weight_decay": run.get("weight_decay", 0.1), "optimizer": "adamw",
           "eval_every": run.get("eval_every"), "ckpt_every": run.get("ckpt_every"), "log_every": 10,
           "activation_checkpointing": bool(run.get("gradient_checkpointing", False)),
           **{k: run[k] for k in ("keep_last_k", "final_checkpoint") if k in run}}
    cfg.update(plan.train_config_overrides())
    return cfg


class JoinedRows(torch.utils.data.Dataset):
    """Sequences of `k` consecutive rows of a packed split (`hybridlab.data.packed_dataset.PackedDataset`)."""

    def __init__(self, rows: Any, k: int):
        if k < 1:
            raise HybridlabError(f"rows per sequence must be >= 1, got {k}")
        if len(rows) < k:
            raise HybridlabError(f"the split has {len(rows)} packed rows, fewer than the {k} one sequence needs; "
                                 "lower context_len or pack more text")
        self.rows, self.k = rows, k
        self.langs = [rows.langs[i * k] for i in range(len(rows) // k)]

    def __len__(self) -> int:
        return len(self.rows) // self.k

    def __getitem__(self, i: int):
        from hybridlab.data.packed_dataset import Documents, position_ids

        parts = [self.rows[i * self.k + j] for j in range(self.k)]
        if not isinstance(parts[0], Documents):
            return torch.cat(parts)
        # positions restart only at real document starts (a row start may continue the previous row's text)
        T = self.rows.seq_len
        starts = np.concatenate([self.rows.doc_starts(i * self.k + j) + j * T for j in range(self.k)])
        return Documents(torch.cat([p.input_ids for p in parts]),
                         torch.from_numpy(position_ids(starts, self.k * T)))


def rows_per_sequence(context_len: int, seq_len: int) -> int:
    if context_len % seq_len:
        raise HybridlabError(f"train.bld_nl.context_len={context_len} must be a multiple of the packed mixture's "
                             f"seq_len={seq_len} (sequences are joined packed rows)")
    return context_len // seq_len
