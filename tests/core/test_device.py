"""`hybridlab.device.resolve_device`: the one "cuda if available else cpu" policy, and its one-line errors."""

import pytest
import torch

from hybridlab.device import DEVICES, resolve_device
from hybridlab.errors import HybridlabError

needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


@needs_cpu_only
def test_auto_and_none_are_the_cpu_without_a_gpu():
    assert resolve_device("auto") == resolve_device(None) == resolve_device() == torch.device("cpu")
    assert resolve_device("auto", local_rank=3) == torch.device("cpu")


def test_cpu_is_the_cpu_and_a_torch_device_passes_through():
    assert resolve_device("cpu") == resolve_device("cpu", 2) == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@needs_cpu_only
def test_cuda_without_a_gpu_is_a_one_line_error():
    with pytest.raises(HybridlabError) as e:
        resolve_device("cuda")
    assert str(e.value) == "device=cuda but no CUDA device is visible; set device: cpu or auto"
    with pytest.raises(HybridlabError, match="device=cuda:1 but no CUDA device is visible"):
        resolve_device("cuda:1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_and_cuda_are_the_local_rank_gpu():
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda", local_rank=0) == torch.device("cuda:0")


@pytest.mark.parametrize("bad", ["gpu", "CUDA", "mps", "", "cuda:x"])
def test_a_bad_choice_is_a_one_line_error_naming_the_allowed_values(bad):
    with pytest.raises(HybridlabError) as e:
        resolve_device(bad)
    msg = str(e.value)
    assert "\n" not in msg and f"device={bad!r}" in msg and all(d in msg for d in DEVICES)


def test_fast_is_bf16_on_cuda_and_on_cpus_with_amx_only(monkeypatch):
    """`precision: fast` / `dtype: fast`: bf16 where its matmuls beat fp32 (CUDA, AMX), fp32 otherwise."""
    import torch

    from hybridlab import device as D
    from hybridlab.models.registry import _resolve_dtype
    from hybridlab.train.config import TrainConfig

    cfg = TrainConfig.from_dict({"out_dir": "x", "steps": 1, "micro_batch_size": 1, "lr": 1e-3, "precision": "fast"})
    for amx, cpu in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(D, "_cpu_bf16_fast", lambda amx=amx: amx)
        assert cfg.resolved_precision("cpu") == cpu and cfg.resolved_precision("cuda") == "bf16"
        assert _resolve_dtype("fast", "cpu") == (torch.bfloat16 if amx else torch.float32)
        assert _resolve_dtype("fast", "cuda:0") == torch.bfloat16
    assert TrainConfig.from_dict({"out_dir": "x", "steps": 1, "micro_batch_size": 1, "lr": 1e-3}).resolved_precision(
        "cpu") == "fp32"  # auto stays fp32 on every CPU


@pytest.mark.parametrize("amx,flags,speedup,fast", [
    (True, set(), 0.5, True),                      # AMX tiles: bf16 without a measurement
    (False, {"avx2"}, 9.0, False),                 # no bf16 arithmetic: fp32 without a measurement
    (False, {"avx512_bf16"}, 4.0, True),           # full-width bf16 dot products
    (False, {"avx512_bf16"}, 0.5, False),          # bf16 at half the fp32 rate
    (False, {"avx512_bf16"}, 1.5, True),           # the threshold itself counts as fast
])
def test_cpu_bf16_rule_measures_only_where_the_flags_leave_it_open(monkeypatch, amx, flags, speedup, fast):
    from hybridlab import device as D

    measured = []
    monkeypatch.setattr(D, "_cpu_has_amx", lambda: amx)
    monkeypatch.setattr(D, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(D, "cpu_bf16_speedup", lambda: measured.append(1) or speedup)
    D._cpu_bf16_fast.cache_clear()
    try:
        assert D.bf16_is_fast("cpu") is fast and D.bf16_is_fast("cuda")
        assert len(measured) == (1 if "avx512_bf16" in flags and not amx else 0)
    finally:
        D._cpu_bf16_fast.cache_clear()


def test_cpu_bf16_speedup_is_a_measured_ratio():
    from hybridlab import device as D

    assert D._gemm_seconds(torch.float32, repeats=2) > 0 and 0.05 < D.cpu_bf16_speedup() < 100
