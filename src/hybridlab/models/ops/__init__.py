"""Linear-recurrent mixer ops (Gated DeltaNet, KDA, GLA) with fla-compatible signatures.

Layout ``[B, T, H, D]`` (fla 0.6, ``head_first=False``); states ``[B, H, K, V]``. CUDA tensors go
to flash-linear-attention's Triton kernels, CPU tensors to this package's vectorised chunked PyTorch
implementations (never to Triton), through one helper (:func:`~hybridlab.models.ops.dispatch.fla_dispatch`);
the ``naive_recurrent_*`` functions are per-token references written from the published recurrences
and are the ground truth in tests.
"""

from hybridlab.models.ops.gdn import (
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    naive_recurrent_gdn,
)
from hybridlab.models.ops.gla import chunk_gla, fused_recurrent_gla, naive_recurrent_gla
from hybridlab.models.ops.kda import chunk_kda, fused_recurrent_kda, naive_recurrent_kda

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gla",
    "chunk_kda",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gla",
    "fused_recurrent_kda",
    "naive_recurrent_gdn",
    "naive_recurrent_gla",
    "naive_recurrent_kda",
]
