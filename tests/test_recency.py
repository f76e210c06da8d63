import pytest
import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from hybridlab.errors import HybridlabError
from hybridlab.eval.recency import attention_recency, mean_attention_distance, recency_mass


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
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, intermediate_size=128)
    return Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager").eval()


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
