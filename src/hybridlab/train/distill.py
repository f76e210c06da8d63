"""Two-stage distillation of a dense teacher into its converted hybrid (RADLADS / HALO style).

Definitions (the tasks plug into the shared loop, `hybridlab.train.loop.train`):

- **Stage 1, attention alignment** (`Stage1Task`): for every mixer layer i of the student (the layers
  whose `self_attn` is a `MixerAttention`), the loss is `losses.stage1_alignment_loss` (token-mean
  squared L2 distance, summed over layers) between the student mixer's output and the frozen
  teacher's `self_attn` output of layer i on the same input ids. Summed, each mixer's gradient is
  its own layer's term alone, so with teacher inputs (and no global-norm clipping) a layer trains
  the same whichever other layers are converted. Both outputs are read after `o_proj`
  (what the layer adds to the residual stream before any residual multiplier). Only the mixers'
  parameters train (`freeze_all_but_mixers`). What the student mixer sees (`inputs`):
  * `"teacher"` (default, RADLADS step 1 / HALO): the teacher's own `self_attn` input of layer i
    (its post-norm hidden state), so every layer learns to imitate its attention in isolation and
    the student's decoder stack never runs - only its mixers do;
  * `"student"`: the student's full forward on the same ids, outputs captured by hooks on its
    `MixerAttention` wrappers; earlier mixers' errors then reach later layers' inputs (end to end).
  Teacher inputs/outputs come from forward hooks on the teacher's `self_attn` modules
  (`AttentionCapture`); the teacher runs under `no_grad` in eval mode.
- **Shared stage 1** (`assemble`): a teacher-forced stage 1 of the student with every layer converted
  trains, per layer, exactly what a placement's own stage 1 would (same seed, rows and settings;
  conversion draws each layer's mixer from its own seed). A placement's stage-1 student is then its
  converted student with the mixers copied from that one run.
- **Stage 2, logit distillation** (`Stage2Task`): the whole student trains on the token-mean forward
  KL(p_teacher || p_student) of the next-token distributions at every position of the packed rows,
  `losses.kl_forward_chunked`. Neither model materialises its `[B, T, V]` logits: both run their
  decoder stack only (`model.get_decoder()`), and the logits enter the loss as
  `Projected(final hidden, lm_head weight, lm_head bias, scale)` (`lm_head_side`), computed chunk by
  chunk. `scale = 1 / config.logits_scaling` for Granite-style heads (transformers divides Granite's
  logits by it); tied embeddings need nothing special (the head's weight *is* the embedding matrix,
  so the gradient reaches it through the head). Heads that transform logits further (final logit
  soft-capping) are refused rather than silently distilled wrongly.
- **Learning curves** (`heldout_curve_metrics`): held-out CE and KL(teacher || student) on a fixed
  set of validation rows, the first `rows_per_language` rows of each language (`heldout_rows`, the
  same selection as `tasks.heldout_ce_by_language`), computed with `train.heldout.evaluate_perplexity`
  (scored positions predict x_t from x_<t, t = 1..T-1). Keys: `ce`, `kl` (pooled over all tokens) and
  `ce/<lang>`, `kl/<lang>`; stage 1 adds the held-out alignment loss `align`.
- `eval_interval_steps(tokens, ...)`: a token interval as a whole number of updates (rounded, >= 1),
  so arms with the same batch shape are evaluated at identical token counts.
- Tables over finished runs: `with_overall` adds a lang="all" row (pooled over tokens) to an
  `evaluate_perplexity` table; `tokens_to_baseline` applies `train.heldout.tokens_to_reach` /
  `fraction_of_baseline_tokens` to the stage-2 held-out curves of every placement, with the baseline
  placement's final value as the target (the faster-learning placement needs a fraction < 1).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch
from torch import nn
from torch.utils.data import default_collate

from hybridlab.data.packed_dataset import batch_rows, batch_to, split_batch
from hybridlab.errors import HybridlabError
from hybridlab.models.convert import MixerAttention, hybrid_spec
from hybridlab.models.sites import decoder_layers_or_none
from hybridlab.train.config import tokens_per_update
from hybridlab.train.losses import Projected, kl_forward_chunked, stage1_alignment_loss
from hybridlab.train.tasks import final_hidden, lm_head_side

STAGE1_INPUTS = ("teacher", "student")
MODEL_JSON = ("config.json", "hybrid.json")  # the files besides weights that define a model
# Parameters that live inside a converted layer's MixerAttention wrapper ("model.layers.3.self_attn.mixer.*").
MIXER_PARAM_MARK = ".self_attn.mixer."


# ---- model plumbing ------------------------------------------------------------------------------
def decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = decoder_layers_or_none(model) if hasattr(model, "get_decoder") else None
    if layers is None:
        raise HybridlabError(f"{type(model).__name__} has no decoder layer list (get_decoder().layers); "
                             "distil a transformers causal LM")
    return layers


def mixer_wrappers(student: nn.Module) -> dict[int, MixerAttention]:
    """Layer index -> MixerAttention of every converted layer of a hybrid."""
    spec = hybrid_spec(student)
    layers = decoder_layers(student)
    wrappers = {i: layers[i].self_attn for i in spec.mixer_layers}
    bad = [i for i, w in wrappers.items() if not isinstance(w, MixerAttention)]
    if bad or not wrappers:
        raise HybridlabError(f"student layers {bad or spec.mixer_layers} hold no MixerAttention; load the student "
                             "with hybridlab.models.io.load_hybrid")
    return wrappers


def freeze_all_but_mixers(student: nn.Module) -> list[str]:
    """requires_grad only for the parameters inside the MixerAttention wrappers; returns their names."""
    mixer_wrappers(student)  # a clear error for a non-hybrid
    names = []
    for name, p in student.named_parameters():
        keep = MIXER_PARAM_MARK in f".{name}"
        p.requires_grad_(keep)
        if keep:
            names.append(name)
    return names


def freeze(model: nn.Module) -> nn.Module:
    """The frozen teacher: no parameter requires grad, eval mode (no dropout)."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


class AttentionCapture:
    """Forward hooks on `layers[i].self_attn` storing each layer's input hidden states and output.

    Works for attention modules and MixerAttention wrappers alike (both are called with
    `hidden_states=` and return `(y_BTD, ...)`). `inputs[i]` / `outputs[i]` hold the last forward's
    tensors; call `remove()` when done.
    """

    def __init__(self, model: nn.Module, layers: Sequence[int], keep_inputs: bool = True):
        mods = decoder_layers(model)
        bad = [i for i in layers if not 0 <= i < len(mods)]
        if bad:
            raise HybridlabError(f"layers {bad} are out of range for a {len(mods)}-layer model")
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.handles = [mods[i].self_attn.register_forward_hook(self._hook(i, keep_inputs), with_kwargs=True)
                        for i in layers]

    def _hook(self, i: int, keep_inputs: bool):
        def hook(module, args, kwargs, output):
            if keep_inputs:
                self.inputs[i] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            self.outputs[i] = output[0] if isinstance(output, tuple) else output
        return hook

    def clear(self) -> None:
        self.inputs.clear()
        self.outputs.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.clear()


def as_frozen(teacher) -> "Frozen":
    """A `Frozen` teacher: a plain module is wrapped as replicated (called directly)."""
    from hybridlab.train.fsdp import Frozen

    if isinstance(teacher, Frozen):
        freeze(teacher.model)
        return teacher
    return Frozen(freeze(teacher))


def _teacher_head_side(teacher: nn.Module, batch_BT: torch.Tensor, copy_weight: bool) -> Projected:
    side = lm_head_side(teacher, final_hidden(teacher, batch_BT))
    if not copy_weight:
        return side
    # A sharded teacher frees its gathered head after the call: keep a copy for the chunked KL.
    return Projected(side.hidden, side.weight.detach().clone(),
                     None if side.bias is None else side.bias.detach().clone(), side.scale)


def _param_dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def _to_device(model: nn.Module, device: torch.device) -> None:
    if next(model.parameters()).device != device:
        model.to(device)


# ---- stage 1 ---------------------------------------------------------------------------------------
class Stage1Task:
    """Align every student mixer's output with the teacher attention output of its layer (see docstring).

    The loss's extra scalars are the per-layer alignment losses `align/<layer>`.
    """

    def __init__(self, teacher, student: nn.Module, inputs: str = "teacher"):
        if inputs not in STAGE1_INPUTS:
            raise HybridlabError(f"stage-1 inputs {inputs!r} unknown; use one of {', '.join(STAGE1_INPUTS)}")
        self.frozen = as_frozen(teacher)  # a module (replicated) or a possibly sharded Frozen
        teacher = self.teacher = self.frozen.model
        self.layers = sorted(mixer_wrappers(student))
        if len(decoder_layers(teacher)) != hybrid_spec(student).num_layers:
            raise HybridlabError(f"teacher has {len(decoder_layers(teacher))} layers, the student "
                                 f"{hybrid_spec(student).num_layers}; distil a student converted from this teacher")
        self.inputs = inputs
        self._teacher_cap = AttentionCapture(teacher, self.layers, keep_inputs=inputs == "teacher")
        self._student_cap = AttentionCapture(student, self.layers, keep_inputs=False) if inputs == "student" else None

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """FSDP units of their own: the mixers, which stage 1 may call outside their decoder layer."""
        return list(mixer_wrappers(model).values())

    def layer_outputs(self, model: nn.Module, batch_BT):
        """(student outputs, teacher outputs) per mixer layer for one batch (ids or ``Documents``)."""
        ids, pos = split_batch(batch_BT)
        if not self.frozen.sharded:
            _to_device(self.teacher, ids.device)
        self._teacher_cap.clear()
        with torch.no_grad():
            self.frozen.run(final_hidden, batch_BT)
        t_out = dict(self._teacher_cap.outputs)
        if self.inputs == "teacher":
            wrappers = mixer_wrappers(model)
            # The teacher may run in bf16 (paper) and the student in fp32: feed each mixer its own dtype
            # (under autocast the projections cast anyway; outside it, e.g. the initial evaluation, they must).
            s_out = {i: wrappers[i](self._teacher_cap.inputs[i].to(_param_dtype(wrappers[i])), position_ids=pos)[0]
                     for i in self.layers}
        else:
            self._student_cap.clear()
            final_hidden(model, batch_BT)
            s_out = dict(self._student_cap.outputs)
        self._teacher_cap.clear()
        return s_out, t_out

    def loss(self, model: nn.Module, batch_BT: torch.Tensor):
        s_out, t_out = self.layer_outputs(model, batch_BT)
        loss = stage1_alignment_loss(s_out, t_out, layer_reduction="sum")
        with torch.no_grad():
            per_layer = {f"align/{i}": stage1_alignment_loss({i: s_out[i]}, {i: t_out[i]}) for i in self.layers}
        return loss, per_layer

    def num_tokens(self, batch_BT) -> int:
        return int(split_batch(batch_BT)[0].numel())

    @torch.no_grad()
    def heldout_alignment(self, model: nn.Module, input_ids_NT, batch_size: int) -> float:
        """Alignment loss over held-out rows, mean over layers (comparable across placements; all rows have T
        tokens, so batch losses weigh by rows)."""
        device = next(model.parameters()).device
        total, n = 0.0, 0
        rows = split_batch(input_ids_NT)[0].shape[0]
        for b0 in range(0, rows, batch_size):
            batch = batch_to(batch_rows(input_ids_NT, b0, b0 + batch_size), device)
            s_out, t_out = self.layer_outputs(model, batch)
            b = split_batch(batch)[0].shape[0]
            total += float(stage1_alignment_loss(s_out, t_out)) * b
            n += b
        return total / n

    def clear(self) -> None:
        """Drop captured tensors (e.g. after an evaluation forward the hooks also saw)."""
        self._teacher_cap.clear()
        if self._student_cap is not None:
            self._student_cap.clear()

    def close(self) -> None:
        self._teacher_cap.remove()
        if self._student_cap is not None:
            self._student_cap.remove()


def assemble(student: nn.Module, shared: nn.Module) -> list[int]:
    """Copy the stage-1 mixers of `shared` (every layer converted) into `student`'s converted layers, in place.

    `student` is a placement's converted hybrid (its FA layers the teacher's), `shared` the stage-1 result of
    the same teacher with every layer converted to the same mixer. Returns the layers copied. Refuses a
    `shared` that lacks one of the student's mixer layers or whose mixers differ in kind or shape.
    """
    s_spec, h_spec = hybrid_spec(student), hybrid_spec(shared)
    mine, theirs = mixer_wrappers(student), mixer_wrappers(shared)
    if s_spec.num_layers != h_spec.num_layers or s_spec.mixer_kind != h_spec.mixer_kind:
        raise HybridlabError(f"shared stage 1 is a {h_spec.num_layers}-layer {h_spec.mixer_kind} hybrid, the student "
                             f"a {s_spec.num_layers}-layer {s_spec.mixer_kind} one; assemble from the same "
                             "teacher and mixer")
    missing = sorted(set(mine) - set(theirs))
    if missing:
        raise HybridlabError(f"shared stage 1 has no mixer at layers {missing}; train it with every layer converted")
    from hybridlab.models.mixers import MixerConfig

    if MixerConfig(**s_spec.mixer_config) != MixerConfig(**h_spec.mixer_config):  # defaults filled in
        raise HybridlabError("shared stage 1's mixer config differs from the student's (conv_init, shapes); "
                             "convert both with the same settings")
    with torch.no_grad():
        for i, wrapper in mine.items():
            src = theirs[i].state_dict()
            dst = wrapper.state_dict()
            if src.keys() != dst.keys() or any(src[k].shape != dst[k].shape for k in src):
                raise HybridlabError(f"layer {i}: the shared mixer's parameters differ from the student's")
            wrapper.load_state_dict(src)
    return sorted(mine)


# ---- stage 2 ---------------------------------------------------------------------------------------
class Stage2Task:
    """Forward KL(teacher || student) of the next-token distributions at every position, chunked."""

    def __init__(self, teacher, chunk_tokens: int = 1024, vocab_chunk: int | None = None):
        """`teacher`: a module (replicated) or a `hybridlab.train.fsdp.Frozen` (possibly sharded)."""
        self.frozen = as_frozen(teacher)
        self.teacher = self.frozen.model
        self.chunk_tokens, self.vocab_chunk = chunk_tokens, vocab_chunk

    def loss(self, model: nn.Module, batch_BT):
        if not self.frozen.sharded:
            _to_device(self.teacher, split_batch(batch_BT)[0].device)
        with torch.no_grad():
            teacher_side = self.frozen.run(_teacher_head_side, batch_BT, self.frozen.sharded)
        student_side = lm_head_side(model, final_hidden(model, batch_BT))
        kl = kl_forward_chunked(teacher_side, student_side, chunk_tokens=self.chunk_tokens,
                                vocab_chunk=self.vocab_chunk)
        return kl, {}

    def num_tokens(self, batch_BT) -> int:
        return int(split_batch(batch_BT)[0].numel())


# ---- held-out curves -------------------------------------------------------------------------------
def heldout_rows(dataset, rows_per_language: int | None) -> tuple[torch.Tensor, list[str]]:
    """The first `rows_per_language` rows of each language (all rows if None) as ([N, T], langs).

    The rows are an id tensor, or ``Documents`` of ``[N, T]`` when the dataset yields documents."""
    if rows_per_language is not None and rows_per_language < 1:
        raise HybridlabError(f"rows_per_language={rows_per_language} must be >= 1 (or null for all rows)")
    taken: dict[str, int] = defaultdict(int)
    idx, langs = [], []
    for i, lang in enumerate(dataset.langs):
        if rows_per_language is None or taken[lang] < rows_per_language:
            taken[lang] += 1
            idx.append(i)
            langs.append(lang)
    if not idx:
        raise HybridlabError("the held-out split has no rows; rebuild the mixture with val_fraction > 0")
    return default_collate([dataset[i] for i in idx]), langs


def pooled(frame, column: str) -> float:
    """Token-weighted mean of a per-language column of an `evaluate_perplexity` table."""
    n = frame["n_tokens"].cast(float)
    return float((frame[column] * n).sum() / n.sum())


def heldout_curve_metrics(student: nn.Module, teacher, input_ids_NT: torch.Tensor,
                          langs: Sequence[str], batch_size: int = 8,
                          teacher_memo: dict | None = None) -> dict[str, float]:
    """{"ce", "kl", "ce/<lang>", "kl/<lang>"} of the student on held-out rows (see module docstring).

    `teacher`: a module or a `Frozen` (a sharded one runs the whole evaluation inside its root call).
    `teacher_memo`: a dict kept across the calls of one run on the same rows; it holds the unsharded
    teacher's final hidden states so later curve points run only its head (`evaluate_perplexity`).
    """
    frozen = as_frozen(teacher)
    if frozen.sharded:
        return frozen.run(lambda t: heldout_curve_metrics(student, t, input_ids_NT, langs, batch_size))
    teacher = frozen.model
    from hybridlab.train.heldout import evaluate_perplexity

    device = next(student.parameters()).device
    _to_device(teacher, device)
    table = evaluate_perplexity(student, input_ids_NT, list(langs), model_name="student", teacher=teacher,
                                batch_size=batch_size, device=device, teacher_memo=teacher_memo)
    out = {"ce": pooled(table, "ce"), "kl": pooled(table, "kl")}
    for row in table.iter_rows(named=True):
        out[f"ce/{row['lang']}"] = row["ce"]
        out[f"kl/{row['lang']}"] = row["kl"]
    return out


def eval_interval_steps(interval_tokens: int, micro_batch_size: int, grad_accum: int, seq_len: int) -> int:
    """Updates between evaluations for a token interval: round(tokens / tokens per update), at least 1."""
    if interval_tokens < 1:
        raise HybridlabError(f"eval interval of {interval_tokens} tokens must be >= 1")
    return max(1, round(interval_tokens / tokens_per_update(micro_batch_size, grad_accum, seq_len)))


def grad_norm_groups() -> dict:
    """Per-group gradient norms logged by the loop: converted mixers, kept attention, everything else."""
    return {
        "mixer": lambda n: MIXER_PARAM_MARK in f".{n}",
        "attention": lambda n: ".self_attn." in f".{n}" and MIXER_PARAM_MARK not in f".{n}",
        "other": lambda n: ".self_attn." not in f".{n}",
    }


# ---- run identity ----------------------------------------------------------------------------------
# ---- tables over finished runs ---------------------------------------------------------------------
ALL_LANGS = "all"


def with_overall(table):
    """An `evaluate_perplexity` table plus a lang="all" row pooled over every token (kl stays null if null)."""
    import math

    import polars as pl

    ce = pooled(table, "ce")
    kl = None if table["kl"].null_count() else pooled(table, "kl")
    row = {"model": table["model"][0], "lang": ALL_LANGS, "n_tokens": int(table["n_tokens"].sum()), "ce": ce,
           "ppl": math.exp(ce), "kl": kl}
    return pl.concat([table, pl.DataFrame([row], schema=table.schema)])


def curve(metrics, column: str) -> tuple[list[float], list[float]]:
    """(tokens, value) of one logged eval column of a metrics.parquet, in step order, evaluated rows only."""
    if column not in metrics.columns:
        raise HybridlabError(f"metrics have no column {column!r}; rerun the distillation stage that logs it")
    import polars as pl

    pts = metrics.filter(pl.col(column).is_not_null()).sort("step")
    return pts["tokens"].cast(float).to_list(), pts[column].to_list()


def tokens_to_baseline(curves_by_placement: dict, baseline: str, metrics: Sequence[str] = ("ce", "kl")):
    """Tokens each placement needs to reach the baseline placement's final held-out value (see train.heldout).

    `curves_by_placement` maps placement -> stage-2 metrics frame. One row per placement x metric x lang
    ("all" = the pooled curve): target (the baseline's final value), tokens (first interpolated crossing,
    null if never), baseline_tokens, fraction = tokens / baseline_tokens (null if never reached, or if the
    baseline is already there at its first point, where the ratio is undefined) and the arm's final value.
    """
    import polars as pl

    from hybridlab.train.heldout import fraction_of_baseline_tokens, tokens_to_reach

    if baseline not in curves_by_placement:
        raise HybridlabError(f"baseline placement {baseline!r} has no run (have {sorted(curves_by_placement)}); "
                             "add it to experiments.distill.placements")
    base_cols = curves_by_placement[baseline].columns
    rows = []
    for metric in metrics:
        langs = [ALL_LANGS] + sorted(c.removeprefix(f"eval/{metric}/") for c in base_cols
                                     if c.startswith(f"eval/{metric}/"))
        for lang in langs:
            column = f"eval/{metric}" if lang == ALL_LANGS else f"eval/{metric}/{lang}"
            b_tok, b_val = curve(curves_by_placement[baseline], column)
            target = float(b_val[-1])
            b_reach = tokens_to_reach(b_tok, b_val, target)
            for placement in sorted(curves_by_placement):
                tok, val = curve(curves_by_placement[placement], column)
                reach = tokens_to_reach(tok, val, target)
                fraction = (fraction_of_baseline_tokens(tok, val, b_tok, b_val, target)
                            if reach is not None and b_reach > 0 else None)
                rows.append({"placement": placement, "metric": metric, "lang": lang, "target": target,
                             "tokens": reach, "baseline_tokens": b_reach, "fraction": fraction,
                             "final": float(val[-1])})
    schema = {"placement": pl.String, "metric": pl.String, "lang": pl.String, "target": pl.Float64,
              "tokens": pl.Float64, "baseline_tokens": pl.Float64, "fraction": pl.Float64, "final": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
