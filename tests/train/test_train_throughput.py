"""benchmarks/train_throughput.py: the analytic FLOP counter against the matmuls a real step executes."""

import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from train_throughput import FlopCounter, linear_gemm_time, parse_args  # noqa: E402

from hybridlab.models.convert import convert_to_hybrid  # noqa: E402


class MatmulFlops(TorchDispatchMode):
    """Counts 2 * m * k * n FLOPs for every (batched) matrix product dispatched, out= and in-place forms included."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "bmm"):
            a, b = args[0], args[1]
        elif name in ("addmm", "addmm_", "baddbmm", "baddbmm_"):
            a, b = args[1], args[2]
        else:
            return func(*args, **(kwargs or {}))
        self.flops += 2 * a.numel() * b.shape[-1]  # [.., m, k] @ [.., k, n]
        return func(*args, **(kwargs or {}))


def _toy(layers=2):
    from tiny_models import tiny_qwen3

    return tiny_qwen3(seed=0, vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=layers, head_dim=4,
                      max_position_embeddings=64, tie_word_embeddings=True)


def test_dense_count_is_linear_weights_plus_causal_attention_by_hand():
    model = _toy(layers=1)
    counter = FlopCounter.of(model)
    # q 8x8, k 8x4, v 8x4, o 8x8, gate 8x16, up 8x16, down 16x8, tied LM head 11x8
    assert counter.linear_params == 64 + 32 + 32 + 64 + 128 + 128 + 128 + 88
    attention = 2 * 2 * 2 * 4 * (5 * 6 / 2)  # QK^T and AV, 2 heads x head_dim 4, 15 causal pairs of 5 tokens
    assert counter.forward([5]) == 2 * 664 * 5 + attention
    assert counter.train([5, 5]) == 2 * 3 * (2 * 664 * 5 + attention)


@pytest.mark.parametrize("mixer", [None, "gdn"])
def test_count_matches_executed_matmuls_of_a_training_step(mixer):
    """Every matmul of forward + backward is counted: linear layers exactly, the GDN op's products exactly.

    SDPA attention is not a matrix-product op, so the executed count lacks it and it is added by hand;
    chunk 16 keeps the GDN op's triangular inverse a single triangular solve (not counted by design).
    """
    model = _toy()
    if mixer:
        model = convert_to_hybrid(model, [1], mixer, mixer_overrides={"chunk_size": 16})
    counter = FlopCounter.of(model)
    ids = torch.randint(11, (3, 20))
    with MatmulFlops() as mode:
        model(input_ids=ids).logits.sum().backward()
    attention_layers = 1 if mixer else 2
    attention = 3 * attention_layers * 3 * 2 * 2 * 2 * 4 * (20 * 21 / 2)  # fwd+bwd x layers x sequences
    assert counter.train([20] * 3) == pytest.approx(mode.flops + attention, rel=1e-12)
    with MatmulFlops() as mode, torch.no_grad():
        model(input_ids=ids)
    assert counter.forward([20] * 3) == pytest.approx(mode.flops + attention / 3, rel=1e-12)


def test_linear_gemm_time_times_each_linear_shape_of_a_step_and_counts_every_linear():
    """The GEMM-rate check of the report: it runs each distinct Linear shape's products (forward and both
    backward GEMMs where trained, the forward only for the frozen teacher) once per rep, and its time and
    rate cover every Linear of the step (shape time x how many Linears have that shape)."""
    student, teacher = _toy(2), _toy(1)
    linears = [(m, trained) for model, trained in ((student, True), (teacher, False))
               for m in model.modules() if isinstance(m, torch.nn.Linear)]
    shapes = {(m.in_features, m.out_features, trained) for m, trained in linears}
    tokens, reps = 24, 3

    def readings():  # start/stop pairs: each product's three timed runs take 3 s, 1 s and 2 s; the best is 1 s
        now = 0.0
        while True:
            for duration in (3.0, 1.0, 2.0):
                yield now
                now += duration
                yield now
                now += 10.0

    clock = readings()
    with MatmulFlops() as mode:
        seconds, gflops = linear_gemm_time([(student, True), (teacher, False)], tokens, reps=reps,
                                           clock=lambda: next(clock))
    per_shape = sum((6 if trained else 2) * k * n * tokens for k, n, trained in shapes)
    assert mode.flops == (1 + reps) * per_shape  # one warm-up and `reps` timed runs of each shape's products
    work = sum((6 if trained else 2) * m.weight.numel() * tokens for m, trained in linears)
    assert seconds == sum(3 if trained else 1 for _, trained in linears)  # best 1 s per product of every Linear
    assert work > per_shape and gflops * 1e9 * seconds == pytest.approx(work, rel=1e-9)


def test_bad_arguments_are_rejected(capsys):
    for argv in (["--steps", "0"], ["--threads", "two"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert "error:" in capsys.readouterr().err
