"""A seeded, resumable sampler over a map-style dataset.

Epoch `e` visits the dataset in the order `randperm(n)` drawn from a generator seeded by
`SeedSequence([seed, e])`, so the permutation of any epoch is a pure function of (seed, epoch) and
the sampler's whole state is its position `(epoch, index)`. Batches run across epoch boundaries
(the tail of epoch e is followed by the head of epoch e+1), so no sample is dropped or repeated
within an epoch. Restoring `(epoch, index)` from a checkpoint continues exactly where it stopped.

The loop draws the *global* batch of each update from this one sampler on every rank and then
gives each rank its share of micro-batches, so data order does not depend on the number of ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridlab.errors import HybridlabError


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The visiting order of epoch `epoch` (a permutation of range(n))."""
    seed64 = int(np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0])
    g = torch.Generator().manual_seed(seed64 & ((1 << 63) - 1))
    return torch.randperm(n, generator=g)


class EpochSampler:
    def __init__(self, n: int, seed: int):
        if n <= 0:
            raise HybridlabError("the training dataset is empty; check the data preparation step")
        self.n, self.seed = n, seed
        self.epoch, self.index = 0, 0
        self._perm = epoch_permutation(n, seed, 0)

    def next_indices(self, k: int) -> list[int]:
        """The next `k` dataset indices, crossing epoch boundaries as needed."""
        out: list[int] = []
        while len(out) < k:
            take = min(k - len(out), self.n - self.index)
            out.extend(self._perm[self.index : self.index + take].tolist())
            self.index += take
            if self.index == self.n:
                self.epoch, self.index = self.epoch + 1, 0
                self._perm = epoch_permutation(self.n, self.seed, self.epoch)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "index": self.index}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if sd["n"] != self.n or sd["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for a dataset of {sd['n']} items with seed {sd['seed']}, "
                f"this run has {self.n} items with seed {self.seed}"
            )
        self.epoch, self.index = sd["epoch"], sd["index"]
        self._perm = epoch_permutation(self.n, self.seed, self.epoch)


def rows_after(n: int, seed: int, seen: int) -> list[int]:
    """The rows of a dataset of `n` rows that an `EpochSampler(n, seed)` has not reached after `seen` rows.

    Within its first epoch the sampler visits ``epoch_permutation(n, seed, 0)`` in order, so the unseen rows
    are that permutation's tail; after a whole epoch none is left. A later stage trains on them to read only
    rows an earlier stage (same seed) never saw.
    """
    if seen < 0:
        raise HybridlabError(f"seen={seen} rows must be >= 0")
    if seen >= n:
        return []
    return epoch_permutation(n, seed, 0)[seen:].tolist()
