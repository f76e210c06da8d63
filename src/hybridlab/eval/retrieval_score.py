"""Layer Retrieval Ability Score: how much one layer's token mixer carries the retrieved digits.

Activation patching on Spaced Retrieval (competing-learning / BLD study; the patching recipe follows
causal tracing / activation patching, Meng et al. 2022, Wang et al. 2023). Definitions:

- **Pair.** Inputs A and B from `spaced_retrieval.make_ab_pairs`: same gap, every digit different, so
  they differ only in the stored digits (and, consistently, in the teacher-forced answer copy).
- **Positions** (``positions``), where the mixer output is patched and the margin is read:

  - ``"answer_predicting"`` (default, the study's definition): the single last position of the prompt
    ``$ X1..Xt _xg $``, i.e. the second ``$`` at t+g+1, the last non-masked position before the loss
    starts; it predicts the first answer digit. Its input token (and every token within a short
    convolution's reach, for g >= conv_size - 1) is identical in A and B, so a layer can move the
    prediction there only through what it reads from the stored digits: a local path scores 0.
  - ``"all_answer"`` (this project's earlier variant, kept for comparison): all t answer-predicting
    positions p_k = t+g+1+k (k = 0..t-1, `answer_positions`). Their inputs for k >= 1 are the
    teacher-forced answer copy, which differs between A and B, so B's patched outputs there carry B's
    *local* answer tokens; a layer whose short convolution sees the current token (KDA layer 0) can
    score without retrieving anything. More items per example, hence less noise, but it conflates
    retrieval with local copying.
- **Margin.** For a run x and item (example, k) at a chosen position p_k: m_x = logit_x[p_k, a_k] -
  logit_x[p_k, b_k], with a_k / b_k the k-th digit of A / B (k = 0 only, by default). m_clean: the
  clean run on A; m_B: the clean run on B (negative when the model retrieves B's digit);
  m_patched(l): the run on A with layer l's token-mixer output at the chosen positions replaced by its
  output on B (all other positions keep A's output).
- **Token-mixer output.** What decoder layer l's attention or recurrent mixer adds to the residual
  stream (the module found by `hybridlab.models.sites.find_mixer_sites`: `self_attn`, which is the
  `MixerAttention` wrapper in converted hybrids; the post-attention norm output for post-norm layers).
- **Score.** Over all items of a group (one gap):

      score(l) = sum(m_clean - m_patched(l)) / sum(m_clean - m_B)

  1: patching layer l alone moves the prediction all the way from A's digit to B's; 0: no effect.
  A ratio of sums rather than a mean of per-item ratios, so items on which the model barely
  separates A from B (a tiny per-item denominator) weigh little instead of exploding. When the mean
  denominator is below `min_denominator` the model does not distinguish A from B at all (e.g. before
  it has learned the task, or a model that retrieves nothing) and the score is undefined: NaN (the row
  is kept, with its margins). Scores are not clamped: > 1 (overshoot) or < 0 (patching strengthens A)
  are reported as they are.

Rows (`retrieval_scores`): layer, layer_type, gap, positions, score, n (examples), items (margins
summed: n, or n x t for "all_answer"), margin_clean, margin_patched, margin_b (mean margins over the
items), one per (gap, layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl
import torch
from torch import nn

from hybridlab.data import spaced_retrieval as sr
from hybridlab.device import resolve_device
from hybridlab.errors import HybridlabError

SCHEMA = {
    "layer": pl.Int64, "layer_type": pl.Utf8, "gap": pl.Int64, "positions": pl.Utf8, "score": pl.Float64,
    "n": pl.Int64, "items": pl.Int64, "margin_clean": pl.Float64, "margin_patched": pl.Float64, "margin_b": pl.Float64,
}
POSITIONS = ("answer_predicting", "all_answer")


@dataclass
class _Sums:
    n: int = 0
    items: int = 0
    clean: float = 0.0
    b: float = 0.0
    patched: dict[int, float] | None = None


def _margins(logits_BTV: torch.Tensor, pos_BK: torch.Tensor, a_BK: torch.Tensor, b_BK: torch.Tensor) -> torch.Tensor:
    logits_BKV = torch.gather(logits_BTV, 1, pos_BK[..., None].expand(-1, -1, logits_BTV.shape[-1])).double()
    return logits_BKV.gather(-1, a_BK[..., None]).squeeze(-1) - logits_BKV.gather(-1, b_BK[..., None]).squeeze(-1)


def _hooked_modules(model: nn.Module) -> list[nn.Module]:
    from hybridlab.models.sites import find_decoder_layers, find_mixer_sites

    sites = find_mixer_sites(model)
    _, layers = find_decoder_layers(model)
    return [getattr(layers[s.layer], s.hooked) for s in sites]


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _replace_first(output, new):
    if isinstance(output, tuple):
        return (new, *output[1:])
    if isinstance(output, list):
        return [new, *output[1:]]
    return new


@torch.no_grad()
def retrieval_scores(
    model: nn.Module,
    records_a: sr.RetrievalRecords,
    records_b: sr.RetrievalRecords,
    *,
    layers: Sequence[int] | None = None,
    batch_size: int = 32,
    min_denominator: float = 1e-3,
    positions: str = "answer_predicting",
) -> pl.DataFrame:
    """Per (gap, layer) Layer Retrieval Ability Scores of `model` on the pairs (A[i], B[i]).

    `positions`: "answer_predicting" (default; patch and read only the last prompt position, which
    predicts the first answer digit) or "all_answer" (all t answer-predicting positions); see the
    module docstring for why the default is the study's.
    """
    from hybridlab.train.bld import layer_sites

    if len(records_a) != len(records_b) or not np.array_equal(records_a.gaps_N, records_b.gaps_N):
        raise HybridlabError("retrieval score: A and B must be aligned pairs with equal gaps; use make_ab_pairs")
    if len(records_a) == 0:
        raise HybridlabError("retrieval score: no examples; pass a non-empty split")
    if np.any(records_a.digits_NK == records_b.digits_NK):
        raise HybridlabError("retrieval score: some A/B digits coincide, so their margin is 0; use make_ab_pairs")
    if positions not in POSITIONS:
        raise HybridlabError(f"retrieval score: positions={positions!r} is unknown; use one of {POSITIONS}")
    if batch_size < 1 or not min_denominator > 0:
        raise HybridlabError(f"retrieval score: batch_size={batch_size} must be >= 1, min_denominator > 0")
    sites = layer_sites(model)
    modules = _hooked_modules(model)
    chosen = list(range(len(sites))) if layers is None else sorted(set(layers))
    if any(not 0 <= l < len(sites) for l in chosen):
        raise HybridlabError(f"retrieval score: layers {chosen} out of range for {len(sites)} decoder layers")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()

    state: dict = {"mode": "off"}  # "capture": store outputs at P; "patch": replace layer state["layer"] at P
    captured: dict[int, torch.Tensor] = {}

    def make_hook(layer: int):
        def hook(_module, _args, output):
            pos_BK = state.get("pos")
            if state["mode"] == "capture":
                y = _first(output)
                captured[layer] = y[torch.arange(y.shape[0], device=y.device)[:, None], pos_BK].clone()
            elif state["mode"] == "patch" and state["layer"] == layer:
                y = _first(output).clone()
                y[torch.arange(y.shape[0], device=y.device)[:, None], pos_BK] = captured[layer].to(y.dtype)
                return _replace_first(output, y)
            return None
        return hook

    handles = [m.register_forward_hook(make_hook(i)) for i, m in enumerate(modules) if i in chosen]
    sums: dict[int, _Sums] = {}
    try:
        for g in sorted(set(records_a.gaps_N.tolist())):
            idx = np.flatnonzero(records_a.gaps_N == g)
            acc = sums.setdefault(int(g), _Sums(patched={l: 0.0 for l in chosen}))
            for s in range(0, len(idx), batch_size):
                sel = idx[s:s + batch_size]
                ba, bb = sr.make_batch(records_a, sel), sr.make_batch(records_b, sel)
                pos_BK = ba["answer_pos"].to(device)
                a_BK, b_BK = ba["answer_digits"].to(device), bb["answer_digits"].to(device)
                if positions == "answer_predicting":  # the second `$` (t+g+1): predicts the first digit
                    pos_BK, a_BK, b_BK = pos_BK[:, :1], a_BK[:, :1], b_BK[:, :1]
                state["pos"] = pos_BK

                def run(batch):
                    # one gap per batch: no padding, so no attention_mask is needed
                    return model(input_ids=batch["input_ids"].to(device)).logits

                state["mode"] = "capture"
                m_b = _margins(run(bb), pos_BK, a_BK, b_BK)
                state["mode"] = "off"
                m_clean = _margins(run(ba), pos_BK, a_BK, b_BK)
                acc.n += len(sel)
                acc.items += m_clean.numel()
                acc.clean += float(m_clean.sum())
                acc.b += float(m_b.sum())
                for layer in chosen:
                    state.update(mode="patch", layer=layer)
                    acc.patched[layer] += float(_margins(run(ba), pos_BK, a_BK, b_BK).sum())
                    state["mode"] = "off"
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)

    rows = []
    for g, acc in sorted(sums.items()):
        denom = (acc.clean - acc.b) / acc.items
        for layer in chosen:
            num = (acc.clean - acc.patched[layer]) / acc.items
            rows.append({
                "layer": layer, "layer_type": sites[layer].kind, "gap": g, "positions": positions,
                "score": num / denom if denom >= min_denominator else float("nan"),
                "n": acc.n, "items": acc.items, "margin_clean": acc.clean / acc.items,
                "margin_patched": acc.patched[layer] / acc.items, "margin_b": acc.b / acc.items,
            })
    return pl.DataFrame(rows, schema=SCHEMA)



# --- the retrieval-score table of the eval_retrieval_score rule ------------------------------------------

ARM_COLUMNS = ["arm", "seed", "step", "fraction", "long_gap_fraction"]


def retrieval_score_table(arms: Sequence[str | Path], test: str | Path, params: "RetrievalScoreJob | dict", *, device: str | None = None,
                          log: Callable[[str], None] = print) -> pl.DataFrame:
    """Layer Retrieval Ability Score of every BLD Spaced Retrieval arm directory in `arms`, per score
    checkpoint, layer and gap (the eval_retrieval_score rule; workflow_scripts/eval_retrieval_score.py).

    Each arm's `score_checkpoints/index.json` (written by the bld_sr rule: arm, seed, long_gap_fraction,
    checkpoints [{path, step, fraction}]) lists its checkpoints; each is scored with `retrieval_scores` on
    the A/B pairs (`make_ab_pairs`, seed `seed`) of the first `max_examples_per_gap` test examples per gap
    of the split `test`. `params`: the job's section (`hybridlab.config_spec.RetrievalScoreJob`, or its dict). Columns: arm, seed (the arm's replicate seed), step, fraction,
    long_gap_fraction, then those of `retrieval_scores` (layer, layer_type, gap, positions, score, n,
    items, margin_clean, margin_patched, margin_b); sorted by arm, seed, step, gap, layer.
    """
    import json

    from hybridlab.models.io import load_hybrid
    from hybridlab.train.spaced_retrieval import take_per_gap

    from hybridlab.config_spec import RetrievalScoreJob, job_settings

    job = job_settings(RetrievalScoreJob, params, "eval_retrieval_score.py")
    test_split = take_per_gap(sr.read_split(test), job.max_examples_per_gap)
    records_a, records_b = sr.make_ab_pairs(test_split, job.seed)
    device = resolve_device(device)
    frames = []
    for arm_dir in map(Path, arms):
        index_path = arm_dir / "score_checkpoints" / "index.json"
        if not index_path.is_file():
            raise HybridlabError(f"{index_path} is missing; rebuild the arm with the bld_sr rule")
        index = json.loads(index_path.read_text())
        for ck in index["checkpoints"]:
            model = load_hybrid(arm_dir / ck["path"], device=device)
            rows = retrieval_scores(model, records_a, records_b, batch_size=job.batch_size,
                                    min_denominator=job.min_denominator, positions=job.positions)
            frames.append(rows.with_columns(
                pl.lit(index["arm"]).alias("arm"), pl.lit(index.get("seed"), pl.Int64).alias("seed"),
                pl.lit(ck["step"], pl.Int64).alias("step"),
                pl.lit(ck["fraction"], pl.Float64).alias("fraction"),
                pl.lit(index["long_gap_fraction"], pl.Float64).alias("long_gap_fraction")))
            what = f"{index['arm']} seed {index.get('seed')} step {ck['step']}"
            defined = rows.filter(pl.col("score").is_not_nan())
            if defined.is_empty():
                log(f"{what}: score undefined (the model does not tell A from B yet)")
            else:
                best = defined.sort("score", descending=True).row(0, named=True)
                log(f"{what}: top layer {best['layer']} ({best['layer_type']}, gap {best['gap']}) "
                    f"score {best['score']:.3f}")
    table = pl.concat(frames).select(ARM_COLUMNS + [c for c in frames[0].columns if c not in ARM_COLUMNS])
    return table.sort(["arm", "seed", "step", "gap", "layer"])
