import math

import numpy as np
import pytest
import torch
from tiny_models import tiny_qwen3

from hybridlab.errors import HybridlabError
from hybridlab.eval.perplexity import token_nll
from hybridlab.eval.position_loss import (
    bucket_edges,
    document_windows,
    key_tokens,
    kjv_books,
    long_documents,
    key_token_mask,
    long_ppl,
    loss_by_position,
    run_position_loss,
    short_window_nll,
)


def test_bucket_edges():
    assert bucket_edges(10) == [1, 2, 4, 8, 10]
    assert bucket_edges(9) == [1, 2, 4, 8, 9]
    assert bucket_edges(8, "fixed", width=3) == [1, 3, 6, 8]
    assert bucket_edges(7, "fixed", width=3) == [1, 3, 6, 7]
    with pytest.raises(HybridlabError, match="width"):
        bucket_edges(8, "fixed")
    with pytest.raises(HybridlabError, match="unknown bucket scheme"):
        bucket_edges(8, "linear")


def test_loss_by_position_hand_computed():
    # T = 6 -> targets 1..5; log2 buckets [1,2) [2,4) [4,6)
    nll = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 4.0, 5.0, 6.0, 7.0]])
    df = loss_by_position(nll, bucket_edges(6))
    assert df.to_dicts() == [
        {"bucket_lo": 1, "bucket_hi": 2, "n_tokens": 2, "mean_loss": 2.0},
        {"bucket_lo": 2, "bucket_hi": 4, "n_tokens": 4, "mean_loss": 3.5},
        {"bucket_lo": 4, "bucket_hi": 6, "n_tokens": 4, "mean_loss": 5.5},
    ]
    mask = torch.ones_like(nll, dtype=torch.bool)
    mask[1, 4] = False  # drops the 7
    assert loss_by_position(nll, bucket_edges(6), mask)["mean_loss"].to_list()[2] == pytest.approx((4 + 5 + 6) / 3)


def test_loss_by_position_bootstrap_over_documents_hand_computed():
    # 3 documents, T = 6 (targets 1..5), log2 buckets [1,2) [2,4) [4,6); document r has loss v_r + j/10 at
    # target j + 1 (v = 1, 2, 4), so bucket means per document are v_r + c_bucket (c = 0, 0.15, 0.35) and
    # the pooled bucket mean is 7/3 + c. The ideal bootstrap over 3 documents puts 1/27 > 2.5 % on "document
    # 0 three times" (the smallest mean) and on "document 2 three times" (the largest): the 95 % interval
    # is exactly [1 + c, 4 + c]
    v = torch.tensor([1.0, 2.0, 4.0])[:, None]
    nll = v + torch.arange(5, dtype=torch.float64)[None, :] / 10
    df = loss_by_position(nll, bucket_edges(6), n_boot=4000, seed=0)
    assert df.columns == ["bucket_lo", "bucket_hi", "n_tokens", "mean_loss", "mean_loss_lo", "mean_loss_hi"]
    c = [0.0, 0.15, 0.35]
    assert df["mean_loss"].to_list() == pytest.approx([7 / 3 + x for x in c])
    assert df["mean_loss_lo"].to_list() == pytest.approx([1 + x for x in c], abs=1e-12)
    assert df["mean_loss_hi"].to_list() == pytest.approx([4 + x for x in c], abs=1e-12)
    # the point columns are those without the bootstrap
    assert loss_by_position(nll, bucket_edges(6)).equals(df.select("bucket_lo", "bucket_hi", "n_tokens", "mean_loss"))
    # identical documents: no spread, the interval is the point
    flat = loss_by_position(torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]] * 3), bucket_edges(6), n_boot=100)
    assert flat["mean_loss_lo"].to_list() == flat["mean_loss"].to_list() == flat["mean_loss_hi"].to_list()
    # one document: no interval
    assert loss_by_position(nll[:1], bucket_edges(6), n_boot=100)["mean_loss_lo"].is_nan().all()


def test_loss_by_position_bootstrap_with_mask_matches_an_independent_replicate():
    # unequal token counts per document (a mask): replicate b is sum of the drawn documents' losses over
    # their counted tokens / their token count, drawn here by hand from default_rng(seed)
    nll = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 4.0, 5.0, 6.0, 7.0], [0.5, 0.5, 9.0, 1.0, 2.0]])
    mask = torch.ones_like(nll, dtype=torch.bool)
    mask[1, 4] = mask[2, 2] = False
    df = loss_by_position(nll, bucket_edges(6), mask, n_boot=500, seed=4)
    idx = np.random.default_rng(4).integers(0, 3, size=(500, 3))
    for row in df.iter_rows(named=True):
        lo, hi = row["bucket_lo"] - 1, row["bucket_hi"] - 1
        m = mask[:, lo:hi].numpy()
        s, n = (nll[:, lo:hi].numpy() * m).sum(1), m.sum(1)
        reps = s[idx].sum(1) / n[idx].sum(1)
        assert (row["mean_loss_lo"], row["mean_loss_hi"]) == pytest.approx(tuple(np.quantile(reps, [0.025, 0.975])),
                                                                           rel=1e-12)
    # [4, 6): document 1 keeps 6 only, document 2 keeps 1 and 2 -> pooled (4 + 5 + 6 + 1 + 2) / 5
    assert df["mean_loss"][2] == pytest.approx(18 / 5)


def test_key_tokens_and_long_ppl_hand_computed():
    long = torch.tensor([0.5, 1.0, 3.0, 0.1])
    short = torch.tensor([3.0, 1.5, 6.0, 0.2])  # gains 2.5, 0.5, 3.0, 0.1
    key = key_token_mask(long, short, threshold=2.0)
    assert key.tolist() == [True, False, True, False]
    assert long_ppl(long, key) == pytest.approx(math.exp((0.5 + 3.0) / 2))
    filtered = key_token_mask(long, short, threshold=2.0, min_long_logprob=-2.0)  # log p_long = -3 fails
    assert filtered.tolist() == [True, False, False, False]
    assert long_ppl(long, torch.zeros(4, dtype=torch.bool)) is None


def _qwen3(seed=0):
    return tiny_qwen3(seed=seed).eval()


def _brute_short(model, ids, window, stride):
    """Per target t the documented context: full prefix for t < w + k, else the window of its chunk."""
    out = []
    for t in range(1, len(ids)):
        if t < window + stride:
            s = 0
        else:
            s = ((t - window) // stride) * stride
        with torch.no_grad():
            logits = model(input_ids=ids[None, s:t + 1]).logits
        out.append(float(token_nll(logits, ids[None, s:t + 1])[0, -1]))
    return torch.tensor(out)


@pytest.mark.parametrize("stride", [1, 3])
def test_short_window_nll_matches_per_target_forward(stride):
    model = _qwen3()
    ids = torch.randint(0, 64, (15,), generator=torch.Generator().manual_seed(1))
    got = short_window_nll(model, ids, window=4, stride=stride, batch_size=3)
    torch.testing.assert_close(got, _brute_short(model, ids, 4, stride), atol=1e-5, rtol=1e-5)
    if stride == 1:  # exactly w = 4 context tokens for t > 4: the target at t=10 sees x_6..x_9 only
        with torch.no_grad():
            ref = token_nll(model(input_ids=ids[None, 6:11]).logits, ids[None, 6:11])[0, -1]
        assert float(got[9]) == pytest.approx(float(ref), abs=1e-5)


def test_run_position_loss_end_to_end():
    model = _qwen3()
    docs = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(2))
    res = run_position_loss(model, docs, short_window=4, batch_size=2, threshold=0.05)  # self-identified variant
    assert res.buckets["n_tokens"].sum() == 3 * 19 == res.n_tokens
    with torch.no_grad():
        full = token_nll(model(input_ids=docs).logits, docs)
    torch.testing.assert_close(res.long_nll, full, atol=1e-5, rtol=1e-5)
    assert res.ppl == pytest.approx(math.exp(float(full.double().mean())), rel=1e-5)
    kt = key_tokens(model, docs, short_window=4, batch_size=2, threshold=0.05)
    torch.testing.assert_close(kt.short_nll[:, :4], kt.long_nll[:, :4], atol=1e-5, rtol=1e-5)  # t <= w
    key = (kt.short_nll - kt.long_nll) > 0.05
    assert torch.equal(res.key_mask, key) and torch.equal(kt.mask, key)
    assert res.n_key_tokens == int(key.sum()) > 0
    assert res.long_ppl == pytest.approx(math.exp(float(res.long_nll[key].double().mean())), rel=1e-6)
    boot = run_position_loss(model, docs, short_window=4, batch_size=2, threshold=0.05, key_mask=key, n_boot=200,
                             seed=1).buckets
    assert boot.drop("mean_loss_lo", "mean_loss_hi").equals(res.buckets)
    assert boot.equals(loss_by_position(res.long_nll, bucket_edges(20), n_boot=200, seed=1))
    assert ((boot["mean_loss_lo"] <= boot["mean_loss"]) & (boot["mean_loss"] <= boot["mean_loss_hi"])).all()
    with pytest.raises(HybridlabError, match="shorter than the documents"):
        run_position_loss(model, docs, short_window=19)
    with pytest.raises(HybridlabError, match="key mask has shape"):
        run_position_loss(model, docs, short_window=4, key_mask=key[:, :5])


def test_one_evaluator_gives_every_model_the_same_key_tokens():
    evaluator, a, b = _qwen3(seed=10), _qwen3(seed=11), _qwen3(seed=12)
    docs = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(3))
    kw = dict(short_window=4, batch_size=2, threshold=0.05)
    kt = key_tokens(evaluator, docs, **kw)
    ra = run_position_loss(a, docs, key_mask=kt, **kw)
    rb = run_position_loss(b, docs, key_mask=kt, **kw)
    rb2 = run_position_loss(b, docs, evaluator=evaluator, **kw)
    assert kt.n_key_tokens > 0
    assert torch.equal(ra.key_mask, kt.mask) and torch.equal(rb.key_mask, kt.mask) and torch.equal(rb2.key_mask, kt.mask)
    assert ra.n_key_tokens == rb.n_key_tokens == kt.n_key_tokens
    # each is still scored with its OWN long-context loss on those tokens ...
    assert rb.long_ppl == pytest.approx(math.exp(float(rb.long_nll[kt.mask].double().mean())), rel=1e-6)
    assert ra.long_ppl != rb.long_ppl
    # ... whereas self-identified key tokens differ between the two models (the old behaviour)
    own_a = run_position_loss(a, docs, **kw).key_mask
    own_b = run_position_loss(b, docs, **kw).key_mask
    assert not torch.equal(own_a, own_b)


def test_document_windows_stay_inside_documents_hand_computed():
    # documents of 7, 2, 10 and 4 tokens (ids encode document * 100 + position), windows of 3 tokens:
    # doc 0 -> starts 0, 3; doc 1 -> none (shorter); doc 2 -> 0, 3, 6; doc 3 -> 0
    docs = [[100 * d + t for t in range(n)] for d, n in enumerate([7, 2, 10, 4])]
    w, n_short = document_windows(docs, 3, 10)
    assert n_short == 1
    # breadth-first: every first window, then every second window, ...
    starts = [(0, 0), (2, 0), (3, 0), (0, 3), (2, 3), (2, 6)]
    assert w.tolist() == [[100 * d + s + i for i in range(3)] for d, s in starts]
    assert all(len({x // 100 for x in row}) == 1 for row in w.tolist())  # never across a boundary
    w4, _ = document_windows(docs, 3, 4)
    assert w4.tolist() == w.tolist()[:4]
    with pytest.raises(HybridlabError, match="no document has 11 tokens"):
        document_windows(docs, 11, 4)
    # consecutive windows of the joined stream (the old paper-preset path) cross boundaries: the stream's
    # third 3-token window holds the last token of document 0 and both tokens of document 1
    stream = [x for d in docs for x in d]
    assert len({x // 100 for x in stream[6:9]}) == 2


def test_kjv_books_are_the_66_books_in_order():
    books = kjv_books()
    assert len(books) == 66
    assert books[0][0] == "Genesis" and books[-1][0] == "Revelation"
    assert books[0][1].startswith("In the beginning God created the heaven and the earth.")
    assert long_documents("kjv_books", n_docs=4) == books
    with pytest.raises(HybridlabError, match="unknown position_loss.documents"):
        long_documents("books3", n_docs=4)


def test_position_loss_figure_draws_a_band_per_arm():
    import matplotlib
    import polars as pl
    from matplotlib.collections import PolyCollection

    matplotlib.use("Agg")
    from hybridlab.plots import figures, registry

    rows = [dict(model=f"{m}-{v}", mixer=m, size="xs", variant=v, bucket_lo=lo, bucket_hi=2 * lo, n_tokens=6 * lo,
                 mean_loss=6.0 - 0.01 * lo, mean_loss_lo=5.9 - 0.01 * lo, mean_loss_hi=6.2 - 0.01 * lo, n_docs=3,
                 n_boot=100) for m in ("gdn", "kda") for v in ("baseline", "bld") for lo in (1, 2, 4, 8)]
    fig = figures.position_loss(pl.DataFrame(rows))
    bands = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(bands) == 4  # one per arm
    v = bands[0].get_paths()[0].vertices
    assert round(float(v[:, 1].min()), 6) == 5.82 and round(float(v[:, 1].max()), 6) == 6.19  # lo at 8, hi at 1
    assert "bootstrap over the documents" in registry.CAPTIONS["fig_position_loss"]
    plain = figures.position_loss(pl.DataFrame(rows).drop("mean_loss_lo", "mean_loss_hi"))
    assert not [c for c in plain.axes[0].collections if isinstance(c, PolyCollection)]


def test_the_evaluator_is_an_arm_or_a_teacher_with_the_arms_tokenizer():
    from hybridlab.eval.position_loss import external_evaluator

    arms, teachers = ["kda-baseline", "kda-bld"], {"Qwen/Qwen3-4B": "qwen3", "ibm-granite/granite-4.1-3b": "granite4"}
    assert external_evaluator("kda-baseline", arms, teachers, "qwen3") is None
    assert external_evaluator("Qwen/Qwen3-4B", arms, teachers, "qwen3") == "Qwen/Qwen3-4B"
    with pytest.raises(HybridlabError, match="uses tokenizer 'granite4' but the BLD-NL arms use 'qwen3'"):
        external_evaluator("ibm-granite/granite-4.1-3b", arms, teachers, "qwen3")
    with pytest.raises(HybridlabError, match="'kda-1b-baseline' is neither a BLD-NL arm"):
        external_evaluator("kda-1b-baseline", arms, teachers, "qwen3")
