"""Checks a training job makes of its data before the first update: token ids and token budget.

* Token ids: every id of a packed mixture must index a row of the model's embedding. A mixture built
  with another model's tokenizer (Qwen's ~151K ids fed to Granite's ~100K embedding) fails here with
  one line, instead of a device-side assert on CUDA or silently wrong text on CPU.
* Budget: the tokens a job will consume (updates x sequences per update x tokens per sequence) must
  fit in the mixture's train tokens. A job that would cycle through its data more than once stops with
  one line naming both numbers, unless the config sets ``epochs: n`` for it (then the budget may use
  up to n passes over the data).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hybridlab.errors import HybridlabError

# Rows of tokens.npy read per chunk when a mixture's stats.json has no max_token_id (older mixtures).
_SCAN_ROWS = 4096


def check_token_ids(max_id: int, vocab_size: int, what: str) -> None:
    """One-line error when a token id (the data's largest, `max_id`) is outside a `vocab_size` embedding."""
    if max_id >= vocab_size:
        raise HybridlabError(
            f"{what}: the mixture holds token id {max_id} but the model has {vocab_size} embedding rows; "
            f"build the mixture with this model's own tokenizer"
        )


def mixture_max_id(mixture_dir: str | Path) -> int:
    """Largest token id of a packed mixture (stats.json's ``max_token_id``, else a scan of tokens.npy)."""
    from hybridlab.data.packed_files import read_stats

    stats = read_stats(mixture_dir)
    if "max_token_id" in stats:
        return int(stats["max_token_id"])
    tokens = np.load(Path(mixture_dir) / "tokens.npy", mmap_mode="r")
    return max((int(tokens[i:i + _SCAN_ROWS].max()) for i in range(0, len(tokens), _SCAN_ROWS)), default=-1)


def embedding_rows(model) -> int:
    """Rows of a causal LM's input embedding (its usable vocabulary)."""
    return int(model.get_input_embeddings().num_embeddings)


def check_mixture_vocab(mixture_dir: str | Path, model, what: str) -> int:
    """`check_token_ids` for a mixture directory and a model; returns the mixture's largest id."""
    max_id = mixture_max_id(mixture_dir)
    check_token_ids(max_id, embedding_rows(model), what)
    return max_id


def _sci(x: float) -> str:
    """Token counts as people write them: 61440, 1.7e8, 3.6e9."""
    return str(int(x)) if x < 1e6 else f"{x:.3g}".replace("e+0", "e").replace("e+", "e")


def check_budget(what: str, need_tokens: int, have_tokens: int, *, epochs: int | None = None,
                 why: str = "", fix: str = "add data") -> float:
    """Passes over the data the job makes (need / have); one-line error when it needs more than allowed.

    Without `epochs` the job may read its data at most once; with it, at most `epochs` times.
    `why` explains the budget (e.g. "20 tokens/param"), `fix` names the config key that adds data.
    """
    if have_tokens <= 0:
        raise HybridlabError(f"{what}: the mixture holds no train tokens; {fix}")
    if epochs is not None and epochs < 1:
        raise HybridlabError(f"{what}: epochs={epochs} must be >= 1")
    allowed = epochs or 1
    passes = need_tokens / have_tokens
    if passes > allowed:
        because = f" ({why})" if why else ""
        if epochs is None:
            raise HybridlabError(
                f"{what} needs {_sci(need_tokens)} tokens{because} but the mixture holds {_sci(have_tokens)}; "
                f"{fix} or set epochs: {math.ceil(passes)}"
            )
        raise HybridlabError(
            f"{what} needs {_sci(need_tokens)} tokens{because} but epochs: {epochs} of the mixture hold "
            f"{_sci(allowed * have_tokens)}; {fix} or set epochs: {math.ceil(passes)}"
        )
    return passes


def check_train_data(mixture_dir: str | Path, model, *, what: str, need_tokens: int, epochs: int | None = None,
                     why: str = "", fix: str = "add data") -> None:
    """Both checks for one training job on a packed mixture (called before the first update)."""
    from hybridlab.data.packed_files import read_stats

    check_mixture_vocab(mixture_dir, model, what)
    passes = check_budget(what, need_tokens, int(read_stats(mixture_dir)["train_tokens"]), epochs=epochs,
                          why=why, fix=fix)
    print(f"{what}: {_sci(need_tokens)} tokens = {passes:.2f} passes over the mixture's train tokens")
