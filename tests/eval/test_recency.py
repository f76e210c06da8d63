import math

import numpy as np
import pytest
import torch
from torch import nn
from tiny_models import tiny_qwen3

from hybridlab.errors import HybridlabError
from hybridlab.eval import stats
from hybridlab.eval.recency import attention_recency, mean_attention_distance, recency_mass
from hybridlab.eval.stats import pooled_mean_ci


def _toy_attention():
    """T=4, three heads: uniform causal, sink on key 0, diagonal only."""
    T = 4
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1).view(-1, 1)
    sink = torch.zeros(T, T)
    sink[:, 0] = 1.0
    diag = torch.eye(T)
    return torch.stack([uniform, sink, diag]).unsqueeze(0)  # [1, 3, 4, 4]


def test_recency_mass_hand_computed():
    A = _toy_attention()
    # uniform: w=1 -> q=1,2,3: 1/2, 1/3, 1/4 -> 13/36; w=2 -> q=2: 2/3, q=3: 2/4 -> 7/12
    torch.testing.assert_close(recency_mass(A, 1), torch.tensor([13 / 36, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(recency_mass(A, 2), torch.tensor([7 / 12, 0.0, 1.0], dtype=torch.float64))
    # w=3 -> only q=3: uniform 3/4, sink 0 (key 0 is outside (0, 3])
    torch.testing.assert_close(recency_mass(A, 3), torch.tensor([3 / 4, 0.0, 1.0], dtype=torch.float64))
    with pytest.raises(HybridlabError, match="no query position"):
        recency_mass(A, 4)


def test_mean_attention_distance_hand_computed():
    A = _toy_attention()
    # uniform: q=0..3 -> 0, 1/2, 1, 3/2 -> 3/4; sink: 0,1,2,3 -> 3/2; diagonal: 0
    torch.testing.assert_close(mean_attention_distance(A), torch.tensor([0.75, 1.5, 0.0], dtype=torch.float64))


def test_padding_queries_are_excluded():
    A = _toy_attention().repeat(2, 1, 1, 1)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    # sink head: distances over queries 0,1,2,3 (row 0) and 0,1 (row 1) -> (6 + 1) / 6
    assert float(mean_attention_distance(A, mask)[1]) == pytest.approx(7 / 6)
    # uniform head, w=1: row 0 -> 1/2+1/3+1/4, row 1 -> q=1 only: 1/2; 4 eligible queries
    assert float(recency_mass(A, 1, mask)[0]) == pytest.approx((13 / 12 + 1 / 2) / 4)


def _eager_qwen3():
    return tiny_qwen3(seed=0, attn_implementation="eager", vocab_size=128, hidden_size=64, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128).eval()


def test_runner_matches_direct_computation_with_padding_and_batches():
    model = _eager_qwen3()
    seqs = [list(range(1, 13)), list(range(20, 29)), list(range(40, 52))]
    df = attention_recency(model, seqs, fa_layers=[1], windows=[2, 4], batch_size=2)
    assert df.columns == ["layer", "head", "window", "mass", "mean_distance"]
    assert df.height == 1 * 4 * 2
    # reference: each sequence alone (no padding), pooled by query counts
    mass_sum, mass_n, dist_sum, dist_n = torch.zeros(4, dtype=torch.float64), 0, torch.zeros(4, dtype=torch.float64), 0
    for s in seqs:
        with torch.no_grad():
            att = model(input_ids=torch.tensor([s]), output_attentions=True).attentions[1]
        T = len(s)
        mass_sum += recency_mass(att, 4) * (T - 4)
        mass_n += T - 4
        dist_sum += mean_attention_distance(att) * T
        dist_n += T
    got = df.filter(df["window"] == 4).sort("head")
    torch.testing.assert_close(torch.tensor(got["mass"].to_list(), dtype=torch.float64), mass_sum / mass_n)
    torch.testing.assert_close(torch.tensor(got["mean_distance"].to_list(), dtype=torch.float64), dist_sum / dist_n)
    assert 0.0 < got["mass"].min() and got["mass"].max() < 1.0


class _NoWeightsMixer(nn.Module):
    def forward(self, hidden_states, **kwargs):
        return hidden_states * 0.5, None


def test_runner_rejects_non_eager_models_and_non_fa_layers():
    model = _eager_qwen3()
    model.model.layers[0].self_attn = _NoWeightsMixer()  # a converted (recurrent) layer
    df = attention_recency(model, [list(range(1, 9))], fa_layers=[1], windows=[1])
    assert df.height == 4
    with pytest.raises(HybridlabError, match="returned no attention weights"):
        attention_recency(model, [list(range(1, 9))], fa_layers=[0], windows=[1])
    with pytest.raises(HybridlabError, match="not a full-attention layer"):
        attention_recency(model, [list(range(1, 9))], fa_layers=[5], windows=[1])
    model.config._attn_implementation = "sdpa"
    with pytest.raises(HybridlabError, match="attn_implementation='eager'"):
        attention_recency(model, [list(range(1, 9))], fa_layers=[1], windows=[1])


# --- bootstrap over sequences -----------------------------------------------------------------------------


def _independent_ratio_bootstrap(sums, counts, n_boot, seed):
    """The documented replicate by hand: n unit indices per replicate from default_rng(seed), pooled ratio,
    numpy's linear 2.5 / 97.5 % quantiles."""
    s, n = np.asarray(sums, float), np.asarray(counts, float)
    idx = np.random.default_rng(seed).integers(0, s.size, size=(n_boot, s.size))
    reps = s[idx].sum(1) / n[idx].sum(1)
    return tuple(np.quantile(reps, [0.025, 0.975]))


def test_pooled_mean_ci_hand_computed():
    # 3 units with per-unit means 1, 2, 3 and counts 1, 1, 2: pooled mean 9/4. The ideal bootstrap puts
    # 1/27 > 2.5 % on "unit 1 drawn three times" (ratio 1, the smallest) and 1/27 on "unit 3 three times"
    # (6/2 = 3, the largest), so its 95 % percentile interval is exactly [1, 3]
    lo, hi = pooled_mean_ci([1.0, 2.0, 6.0], [1, 1, 2], n_boot=4000, seed=0)
    assert (lo, hi) == pytest.approx((1.0, 3.0), abs=1e-12)
    # and every replicate as computed independently here
    for seed, n_boot in ((0, 200), (7, 1000)):
        got = pooled_mean_ci([1.0, 2.0, 6.0], [1, 1, 2], n_boot=n_boot, seed=seed)
        assert got == pytest.approx(_independent_ratio_bootstrap([1.0, 2.0, 6.0], [1, 1, 2], n_boot, seed), abs=1e-12)
    # equal counts: the vectorised path draws the same replicates as the ratio path
    s, n = [3.0, 8.0, 1.0, 5.0], [4, 4, 4, 4]
    direct = stats.bootstrap_ci_indices(4, lambda i: np.sum(np.asarray(s)[i]) / 16.0, n_boot=500, seed=3)
    assert pooled_mean_ci(s, n, n_boot=500, seed=3) == pytest.approx((direct.lo, direct.hi), abs=1e-12)
    assert pooled_mean_ci(s, n, n_boot=500, seed=3) == pytest.approx(_independent_ratio_bootstrap(s, n, 500, 3),
                                                                       abs=1e-12)


def test_pooled_mean_ci_degenerate_cases():
    assert pooled_mean_ci([2.0, 2.0, 2.0], [1, 1, 1], n_boot=100) == (2.0, 2.0)  # no spread: the point
    assert all(math.isnan(x) for x in pooled_mean_ci([2.0], [1], n_boot=100))  # one unit
    assert all(math.isnan(x) for x in pooled_mean_ci([2.0, 3.0], [1, 1], n_boot=0))
    assert all(math.isnan(x) for x in pooled_mean_ci([0.0, 0.0], [0, 0], n_boot=100))  # nothing counted
    # a unit without counted items only dilutes the draws; 0/0 replicates are dropped
    lo, hi = pooled_mean_ci([0.0, 4.0, 2.0], [0, 2, 2], n_boot=2000, seed=1)
    assert (lo, hi) == pytest.approx((1.0, 2.0), abs=1e-12)
    with pytest.raises(HybridlabError, match="n_boot must be 0"):
        pooled_mean_ci([1.0, 2.0], [1, 1], n_boot=5)
    with pytest.raises(HybridlabError, match="aligned"):
        pooled_mean_ci([1.0, 2.0], [1], n_boot=100)


def test_runner_bootstrap_over_sequences_hand_checked():
    model = _eager_qwen3()
    seqs = [list(range(1, 13)), list(range(20, 29)), list(range(40, 52))]  # 12, 9 and 12 tokens
    df = attention_recency(model, seqs, fa_layers=[1], windows=[4], batch_size=2, n_boot=300, seed=5)
    assert df.columns == ["layer", "head", "window", "mass", "mean_distance", "mass_lo", "mass_hi",
                          "mean_distance_lo", "mean_distance_hi"]
    # reference: each sequence alone; its sums over queries and their counts, bootstrapped by hand
    mass_s, dist_s = [], []
    for s in seqs:
        with torch.no_grad():
            att = model(input_ids=torch.tensor([s]), output_attentions=True).attentions[1]
        mass_s.append((recency_mass(att, 4) * (len(s) - 4)).tolist())
        dist_s.append((mean_attention_distance(att) * len(s)).tolist())
    mass_s, dist_s = np.array(mass_s), np.array(dist_s)
    for h, row in enumerate(df.sort("head").iter_rows(named=True)):
        lo, hi = _independent_ratio_bootstrap(mass_s[:, h], [8, 5, 8], 300, 5)
        assert (row["mass_lo"], row["mass_hi"]) == pytest.approx((lo, hi), rel=1e-5)
        lo, hi = _independent_ratio_bootstrap(dist_s[:, h], [12, 9, 12], 300, 5)
        assert (row["mean_distance_lo"], row["mean_distance_hi"]) == pytest.approx((lo, hi), rel=1e-5)
        assert row["mass_lo"] <= row["mass"] <= row["mass_hi"]
    # the point values do not depend on n_boot
    plain = attention_recency(model, seqs, fa_layers=[1], windows=[4], batch_size=2)
    assert plain.columns == ["layer", "head", "window", "mass", "mean_distance"]
    assert plain.equals(df.select(plain.columns))
    # three copies of one sequence: no spread, the interval is the point
    same = attention_recency(model, [seqs[0]] * 3, fa_layers=[1], windows=[4], n_boot=100)
    for c in ("mass", "mean_distance"):
        np.testing.assert_allclose(same[f"{c}_lo"].to_numpy(), same[c].to_numpy(), rtol=1e-6)
        np.testing.assert_allclose(same[f"{c}_hi"].to_numpy(), same[c].to_numpy(), rtol=1e-6)
    one = attention_recency(model, [seqs[0]], fa_layers=[1], windows=[4], n_boot=100)
    assert one["mass_lo"].is_nan().all() and one["mean_distance_hi"].is_nan().all()


def _recency_table(with_ci=True):
    import polars as pl

    rows = []
    for model, role, layers in [("teacher", "dense", [0, 1]), ("teacher/sp-gdn", "hybrid", [1])]:
        for layer in layers:
            for head in range(2):
                for w in (1, 4, 16):
                    m, d = min(1.0, 0.1 * w) / (2 if role == "hybrid" else 1), 3.0 + layer + head
                    row = dict(model=model, pair="teacher vs sp-gdn", role=role, lang="hin_Deva", layer=layer,
                               head=head, window=w, mass=m, mean_distance=d, n_sequences=3, input_tokens=32)
                    if with_ci:
                        row.update(mass_lo=m - 0.01 * (head + 1), mass_hi=m + 0.02, mean_distance_lo=d - 0.5 * (head + 1),
                                   mean_distance_hi=d + 1.0)
                    rows.append(row)
    return pl.DataFrame(rows)


def test_recency_figure_draws_the_intervals():
    import matplotlib
    from matplotlib.collections import PolyCollection

    matplotlib.use("Agg")
    from hybridlab.plots import figures, registry

    fig = figures.recency(_recency_table())
    top, bottom = fig.axes[0], fig.axes[1]
    # error bars: mean over the two heads of each bound, e.g. dense layer 0: d = 3, 4 -> bar 3.5,
    # lo mean(2.5, 3.0) = 2.75, hi mean(4, 5) = 4.5; hybrid layer 1: bar 4.5, [3.75, 5.5]
    segs = sorted(tuple(round(float(y), 6) for y in seg[:, 1]) for c in top.containers
                  if type(c).__name__ == "ErrorbarContainer" for seg in c.lines[2][0].get_segments())
    assert segs == [(2.75, 4.5), (3.75, 5.5), (3.75, 5.5)]
    # bands: one per role, mean bounds over the heads at each window (dense w=1: 0.1 - 0.015 .. 0.12)
    bands = [c for c in bottom.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    ys = sorted(round(float(y), 6) for y in bands[1].get_paths()[0].vertices[:, 1])
    assert 0.085 in ys and 0.12 in ys
    assert "bootstrap over the input sequences" in registry.CAPTIONS["fig_recency"]
    # a table without the interval columns still draws (no bars, no bands)
    plain = figures.recency(_recency_table(with_ci=False))
    assert not [c for c in plain.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
