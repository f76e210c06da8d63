"""Losses: chunked KL and CE vs naive references (values and gradients, fp64), alignment, accuracy."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hybridlab.errors import HybridlabError
from hybridlab.train import losses
from hybridlab.train.losses import (
    Projected,
    answer_accuracy,
    ce_chunked,
    kl_forward_chunked,
    masked_ce,
    stage1_alignment_loss,
    token_kl_chunked,
    token_nll_chunked,
)


def naive_kl(t_logits, s_logits, mask):
    logp_t = t_logits.log_softmax(-1)
    logp_s = s_logits.log_softmax(-1)
    kl_BT = (logp_t.exp() * (logp_t - logp_s)).sum(-1)
    m = mask.float()
    return (kl_BT * m).sum() / m.sum()


class _MatmulCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return func(*args, **(kwargs or {}))


def _setup(B=2, T=7, D=5, V=23, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()
    th, tw, sh, sw = mk(B, T, D), mk(V, D), mk(B, T, D), mk(V, D)
    tb, sb = (mk(V), mk(V)) if bias else (None, None)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[0, 0] = True
    return th, tw, tb, sh, sw, sb, mask


def test_kl_of_model_against_itself_is_zero():
    th, tw, tb, *_ , mask = _setup()
    for vc in (None, 4):
        kl = kl_forward_chunked(Projected(th, tw, tb), Projected(th, tw, tb), mask, chunk_tokens=3, vocab_chunk=vc)
        assert abs(kl.item()) < 1e-12
    logits = th @ tw.T
    assert abs(kl_forward_chunked(logits, logits, mask, chunk_tokens=4).item()) < 1e-12


@pytest.mark.parametrize("chunk_tokens,vocab_chunk", [(3, 5), (100, None), (1, 23)])
def test_projected_chunked_matches_naive_values_and_gradients(chunk_tokens, vocab_chunk):
    th, tw, tb, sh, sw, sb, mask = _setup()
    scale = 0.7
    tensors = [th, tw, tb, sh, sw, sb]
    kl = kl_forward_chunked(
        Projected(th, tw, tb, scale), Projected(sh, sw, sb, scale), mask, chunk_tokens, vocab_chunk
    )
    grads = torch.autograd.grad(kl, tensors)
    ref = naive_kl((th @ tw.T + tb) * scale, (sh @ sw.T + sb) * scale, mask)
    ref_grads = torch.autograd.grad(ref, tensors)
    assert ref.item() > 0.1  # non-trivial case
    torch.testing.assert_close(kl.double(), ref.double(), rtol=1e-6, atol=1e-8)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


def test_logits_mode_and_mixed_sides_match_naive():
    th, tw, tb, sh, sw, sb, mask = _setup(bias=False)
    ref = naive_kl(th @ tw.T, sh @ sw.T, mask)
    ref_g = torch.autograd.grad(ref, [th, tw, sh, sw])
    for mode in ("both_logits", "student_projected", "teacher_projected"):
        t_side = Projected(th, tw) if mode == "teacher_projected" else th @ tw.T
        s_side = Projected(sh, sw) if mode == "student_projected" else sh @ sw.T
        kl = kl_forward_chunked(t_side, s_side, mask, chunk_tokens=4, vocab_chunk=6)
        torch.testing.assert_close(kl.double(), ref.double(), rtol=1e-6, atol=1e-8)
        got = torch.autograd.grad(kl, [th, tw, sh, sw])
        for a, b in zip(got, ref_g):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


def test_detached_teacher_gets_no_gradient_and_mask_none_means_all_tokens():
    th, tw, _, sh, sw, _, _ = _setup(bias=False)
    kl = kl_forward_chunked(Projected(th.detach(), tw.detach()), Projected(sh, sw), None, chunk_tokens=5)
    (g,) = torch.autograd.grad(kl, [sh])
    ref = naive_kl(th.detach() @ tw.detach().T, sh @ sw.T, torch.ones(2, 7, dtype=torch.bool))
    (rg,) = torch.autograd.grad(ref, [sh])
    torch.testing.assert_close(g, rg)


@pytest.mark.parametrize("kept", [True, False])
@pytest.mark.parametrize("chunk_tokens,vocab_chunk", [(3, None), (100, 23), (2, 5)])
def test_frozen_teacher_kl_matches_naive_fp64_with_kept_or_recomputed_logits(chunk_tokens, vocab_chunk, kept,
                                                                              monkeypatch):
    """A frozen teacher with one vocabulary chunk keeps (p_t, log p_s) for the backward (under
    KEPT_LOGITS_ELEMENTS); several vocabulary chunks, or a limit of 0, recompute. Same values either way."""
    if not kept:
        monkeypatch.setattr(losses, "KEPT_LOGITS_ELEMENTS", 0)
    th, tw, tb, sh, sw, sb, mask = _setup()
    teacher = Projected(th.detach(), tw.detach(), tb.detach(), 0.7)
    kl = kl_forward_chunked(teacher, Projected(sh, sw, sb, 0.7), mask, chunk_tokens, vocab_chunk)
    ref = naive_kl((th @ tw.T + tb).detach() * 0.7, (sh @ sw.T + sb) * 0.7, mask)
    torch.testing.assert_close(kl, ref, rtol=1e-10, atol=1e-12)
    for got, want in zip(torch.autograd.grad(kl, [sh, sw, sb]), torch.autograd.grad(ref, [sh, sw, sb])):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("limit,backward_matmuls", [(None, 2 * 3), (0, 4 * 3)])
def test_kl_backward_reuses_the_kept_probabilities(limit, backward_matmuls, monkeypatch):
    """3 row chunks: kept, the backward runs the student's 2 products per chunk; recomputing, both heads too."""
    if limit is not None:
        monkeypatch.setattr(losses, "KEPT_LOGITS_ELEMENTS", limit)
    th, tw, _, sh, sw, _, _ = _setup(bias=False)
    kl = kl_forward_chunked(Projected(th.detach(), tw.detach()), Projected(sh, sw), None, chunk_tokens=5)
    with _MatmulCount() as count:
        first = torch.autograd.grad(kl, [sh, sw], retain_graph=True)
    assert count.n == backward_matmuls
    for a, b in zip(first, torch.autograd.grad(kl, [sh, sw])):  # the second backward recomputes
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _MaxNumel(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.max = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.max = max(self.max, t.numel())
        return out


def test_projected_path_never_materialises_full_logits():
    B, T, D, V = 2, 16, 4, 400
    th, tw = torch.randn(B, T, D), torch.randn(V, D)
    sh, sw = torch.randn(B, T, D, requires_grad=True), torch.randn(V, D, requires_grad=True)
    with _MaxNumel() as mode:
        kl = kl_forward_chunked(Projected(th, tw), Projected(sh, sw), None, chunk_tokens=8, vocab_chunk=100)
        kl.backward()
    # Largest intermediate: a weight-shaped gradient (V*D) or a chunk of logits (8*100), never B*T*V.
    assert mode.max <= max(V * D, 8 * 100)
    assert mode.max < B * T * V
    assert sw.grad is not None and torch.isfinite(sw.grad).all()


def test_kl_errors():
    th, tw, _, sh, sw, _, mask = _setup(bias=False)
    with pytest.raises(HybridlabError, match="selects no token"):
        kl_forward_chunked(Projected(th, tw), Projected(sh, sw), torch.zeros_like(mask))
    with pytest.raises(HybridlabError, match="vocab"):
        kl_forward_chunked(Projected(th, tw), Projected(sh, sw[:5]), mask)


def test_stage1_alignment_hand_computed():
    s = [torch.tensor([[[1.0, 2.0], [0.0, 0.0]]]), torch.tensor([[[3.0, 0.0], [1.0, 1.0]]])]
    t = [torch.zeros(1, 2, 2), torch.tensor([[[0.0, 4.0], [1.0, 1.0]]])]
    # layer 0: token sq norms 5, 0 -> mean 2.5; layer 1: 9+16=25, 0 -> 12.5
    assert stage1_alignment_loss(s, t).item() == pytest.approx((2.5 + 12.5) / 2)
    assert stage1_alignment_loss(s, t, layer_reduction="sum").item() == pytest.approx(15.0)
    mask = torch.tensor([[True, False]])
    assert stage1_alignment_loss(s, t, mask).item() == pytest.approx((5 + 25) / 2)
    d = stage1_alignment_loss({3: s[0], 7: s[1]}, {3: t[0], 7: t[1]})
    assert d.item() == pytest.approx(7.5)
    with pytest.raises(HybridlabError):
        stage1_alignment_loss({3: s[0]}, {4: t[0]})


def test_masked_ce_and_answer_accuracy():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0]],
                           [[1.0, 0.0, 0.0], [0.0, 0.0, 5.0], [4.0, 0.0, 0.0]]])
    labels = torch.tensor([[-100, 1, 2], [-100, 1, 0]])
    lse = lambda row: math.log(sum(math.exp(x) for x in row))
    want = ((lse([0, 3, 0]) - 3) + (lse([0, 0, 1]) - 1) + (lse([0, 0, 5]) - 0) + (lse([4, 0, 0]) - 4)) / 4
    assert masked_ce(logits, labels).item() == pytest.approx(want, rel=1e-6)
    assert masked_ce(logits, labels).item() == pytest.approx(
        F.cross_entropy(logits.reshape(-1, 3), labels.reshape(-1)).item(), rel=1e-6)
    # sequence 0: both answers right; sequence 1: one of two wrong
    assert answer_accuracy(logits, labels).item() == pytest.approx(0.5)
    assert answer_accuracy(logits, labels, per_sequence=False).item() == pytest.approx(3 / 4)
    with pytest.raises(HybridlabError):
        masked_ce(logits, torch.full_like(labels, -100))


@pytest.mark.parametrize("kept_logits", [True, False])
@pytest.mark.parametrize("chunk_tokens,vocab_chunk", [(3, 5), (100, None), (1, 23)])
def test_chunked_ce_matches_cross_entropy_values_and_gradients_fp64(chunk_tokens, vocab_chunk, kept_logits,
                                                                    monkeypatch):
    """Both backward paths: the forward's logits kept (small) or recomputed (over KEPT_LOGITS_ELEMENTS)."""
    if not kept_logits:
        monkeypatch.setattr(losses, "KEPT_LOGITS_ELEMENTS", 0)
    _, _, _, sh, sw, sb, mask = _setup()
    labels = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(3))
    labels[~mask] = -100
    ce = ce_chunked(Projected(sh, sw, sb, 0.7), labels, -100, chunk_tokens, vocab_chunk)
    ref = F.cross_entropy(((sh @ sw.T + sb) * 0.7).reshape(-1, 23), labels.reshape(-1), ignore_index=-100)
    assert ce.dtype == torch.float64
    torch.testing.assert_close(ce, ref, rtol=1e-10, atol=1e-12)
    for got, want in zip(torch.autograd.grad(ce, [sh, sw, sb]), torch.autograd.grad(ref, [sh, sw, sb])):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    logits = (sh @ sw.T + sb).detach().requires_grad_()
    ce_l = ce_chunked(logits, labels, vocab_chunk=vocab_chunk)
    ref_l = F.cross_entropy(logits.reshape(-1, 23), labels.reshape(-1))
    torch.testing.assert_close(ce_l, ref_l, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(ce_l, logits)[0], torch.autograd.grad(ref_l, logits)[0])


@pytest.mark.parametrize("limit,backward_matmuls", [(None, 2 * 4), (0, 3 * 4)])
def test_ce_backward_reuses_the_kept_logits_and_a_second_backward_recomputes(limit, backward_matmuls, monkeypatch):
    """4 chunks of logits: with the logits kept the backward runs 2 products per chunk (d hidden, d weight),
    recomputing them 3; a retained graph's second backward finds nothing kept and gives the same gradients."""
    if limit is not None:
        monkeypatch.setattr(losses, "KEPT_LOGITS_ELEMENTS", limit)
    _, _, _, sh, sw, _, _ = _setup()
    labels = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(3))
    ce = ce_chunked(Projected(sh, sw), labels, chunk_tokens=4)  # 14 tokens -> 4 row chunks
    with _MatmulCount() as count:
        first = torch.autograd.grad(ce, [sh, sw], retain_graph=True)
    assert count.n == backward_matmuls
    second = torch.autograd.grad(ce, [sh, sw])
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_token_nll_and_kl_chunked_match_naive_per_token():
    th, tw, tb, sh, sw, sb, _ = _setup()
    zt, zs = (th @ tw.T + tb).detach(), (sh @ sw.T + sb).detach()
    targets = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(4))
    want_nll = -zs.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    for side in (Projected(sh, sw, sb), zs):
        torch.testing.assert_close(token_nll_chunked(side, targets, chunk_tokens=3, vocab_chunk=5), want_nll)
    logp_t, logp_s = zt.log_softmax(-1), zs.log_softmax(-1)
    want_kl = (logp_t.exp() * (logp_t - logp_s)).sum(-1)
    got_kl = token_kl_chunked(Projected(th, tw, tb), Projected(sh, sw, sb), chunk_tokens=4, vocab_chunk=6)
    torch.testing.assert_close(got_kl, want_kl)
    assert got_kl.shape == (2, 7)


def test_projected_ce_never_materialises_full_logits():
    B, T, D, V = 2, 16, 4, 400
    h, w = torch.randn(B, T, D, requires_grad=True), torch.randn(V, D, requires_grad=True)
    labels = torch.randint(0, V, (B, T))
    with _MaxNumel() as mode:
        ce_chunked(Projected(h, w), labels, chunk_tokens=8, vocab_chunk=100).backward()
    assert mode.max <= max(V * D, 8 * 100)
    assert torch.isfinite(w.grad).all() and torch.isfinite(h.grad).all()


def test_ce_errors():
    _, _, _, sh, sw, _, _ = _setup(bias=False)
    with pytest.raises(HybridlabError, match=r"outside \[0, 23\)"):
        ce_chunked(Projected(sh, sw), torch.full((2, 7), 23))
    with pytest.raises(HybridlabError, match="do not align"):
        ce_chunked(Projected(sh, sw), torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(HybridlabError, match="selects no token"):
        ce_chunked(Projected(sh, sw), torch.full((2, 7), -100))
    with pytest.raises(HybridlabError, match="chunk_tokens"):
        ce_chunked(Projected(sh, sw), torch.zeros(2, 7, dtype=torch.long), chunk_tokens=0)


def _qwen(vocab=512):
    from tiny_models import tiny_qwen3

    return tiny_qwen3(seed=0, vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=16).eval()


def test_causal_lm_task_and_heldout_ce_chunked_match_full_logits_and_never_build_them():
    from hybridlab.train.heldout import evaluate_perplexity
    from hybridlab.train.tasks import CausalLMTask, heldout_ce_by_language

    model, teacher = _qwen(), copy_with_noise(_qwen())
    B, T, V = 4, 16, 512  # B*T*V = 32768 > the largest weight (V*D = 16384)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    logits = model(input_ids=ids).logits
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    task = CausalLMTask(chunk_tokens=8, vocab_chunk=100)
    with _MaxNumel() as mode:
        loss, _ = task.loss(model, ids)
        loss.backward()
    assert mode.max < B * T * V
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)

    data = _Rows(ids, ["a", "b", "a", "a"])
    with _MaxNumel() as mode:
        ce = heldout_ce_by_language(model, data, max_rows_per_language=2, batch_size=2, chunk_tokens=8)
        table = evaluate_perplexity(model, ids, data.langs, model_name="m", teacher=teacher, batch_size=4,
                                    chunk_tokens=8, vocab_chunk=100)
    assert mode.max < B * T * V
    with torch.no_grad():
        nll = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none").view(B, -1)
        logp_t, logp_s = teacher(input_ids=ids).logits[:, :-1].log_softmax(-1), logits[:, :-1].log_softmax(-1)
        kl = (logp_t.exp() * (logp_t - logp_s)).sum(-1)
    assert ce["ce/a"] == pytest.approx(nll[[0, 2]].mean().item(), rel=1e-5)  # the first 2 "a" rows
    assert ce["ce/b"] == pytest.approx(nll[1].mean().item(), rel=1e-5)
    rows = {r["lang"]: r for r in table.to_dicts()}
    assert rows["a"]["ce"] == pytest.approx(nll[[0, 2, 3]].mean().item(), rel=1e-5)
    assert rows["a"]["kl"] == pytest.approx(kl[[0, 2, 3]].mean().item(), rel=1e-4, abs=1e-7)
    assert rows["b"]["kl"] == pytest.approx(kl[1].mean().item(), rel=1e-4, abs=1e-7)


class _Rows(list):
    """A PackedDataset stand-in: rows with one language each."""

    def __init__(self, rows, langs):
        super().__init__(rows)
        self.langs = langs


def copy_with_noise(model, scale=0.05):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model
