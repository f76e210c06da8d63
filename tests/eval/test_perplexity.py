import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.eval.perplexity import token_kl, token_nll
from hybridlab.train.heldout import evaluate_perplexity, fraction_of_baseline_tokens, tokens_to_reach


class Bigram(nn.Module):
    """logits[t] = table[x_t]: next-token distribution depends only on the current token."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(table)

    def forward(self, input_ids, **kwargs):
        return SimpleNamespace(logits=self.table[input_ids])


def test_token_nll_and_kl_hand_computed():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.2, 0.7], [1 / 3, 1 / 3, 1 / 3]]]))
    ids = torch.tensor([[0, 1, 2]])
    torch.testing.assert_close(token_nll(logits, ids), torch.tensor([[math.log(4), -math.log(0.7)]]))
    teacher = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    student = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    torch.testing.assert_close(token_kl(teacher, student), torch.tensor([[expected]]))
    assert float(token_kl(student, student).abs().max()) < 1e-7


def test_evaluate_perplexity_pools_tokens_per_language_and_kl():
    p = torch.tensor([[0.5, 0.5], [0.2, 0.8]])  # student: from 0 -> (0.5, 0.5); from 1 -> (0.2, 0.8)
    q = torch.tensor([[0.5, 0.5], [0.6, 0.4]])  # teacher
    student, teacher = Bigram(p.log()), Bigram(q.log())
    ids = torch.tensor([[0, 1, 1], [1, 1, 0], [0, 0, 0]])
    df = evaluate_perplexity(student, ids, ["fra", "fra", "eng"], model_name="s", teacher=teacher, batch_size=2)
    rows = {r["lang"]: r for r in df.to_dicts()}
    # fra: transitions 0->1 (0.5), 1->1 (0.8), 1->1 (0.8), 1->0 (0.2)
    ce_fra = -(math.log(0.5) + 2 * math.log(0.8) + math.log(0.2)) / 4
    assert rows["fra"]["n_tokens"] == 4 and rows["fra"]["ce"] == pytest.approx(ce_fra)
    assert rows["fra"]["ppl"] == pytest.approx(math.exp(ce_fra))
    kl_from_1 = 0.6 * math.log(0.6 / 0.2) + 0.4 * math.log(0.4 / 0.8)
    assert rows["fra"]["kl"] == pytest.approx(3 * kl_from_1 / 4)  # positions from token 0 have KL 0
    assert rows["eng"]["ce"] == pytest.approx(math.log(2)) and rows["eng"]["kl"] == pytest.approx(0.0, abs=1e-7)
    assert rows["fra"]["model"] == "s"
    ids2 = torch.tensor([[0, 1, 1], [1, 1, 0], [1, 0, 1]])
    plain = evaluate_perplexity(student, ids2, ["fra", "fra", "eng"], model_name="s", pad_id=0)
    assert plain["kl"].null_count() == 2
    # pad targets skipped: fra keeps 0->1, 1->1 (row 0) and 1->1 (row 1); eng keeps 0->1 only
    got = {r["lang"]: r for r in plain.to_dicts()}
    assert got["fra"]["n_tokens"] == 3
    assert got["fra"]["ce"] == pytest.approx(-(math.log(0.5) + 2 * math.log(0.8)) / 3)
    assert got["eng"]["n_tokens"] == 1 and got["eng"]["ce"] == pytest.approx(math.log(2))
    with pytest.raises(HybridlabError, match="no scored tokens"):
        evaluate_perplexity(student, torch.zeros(1, 3, dtype=torch.long), ["eng"], model_name="s", pad_id=0)


def test_evaluate_perplexity_input_errors():
    m = Bigram(torch.zeros(2, 2))
    with pytest.raises(HybridlabError, match="one lang per row"):
        evaluate_perplexity(m, torch.zeros(2, 3, dtype=torch.long), ["eng"], model_name="m")
    with pytest.raises(HybridlabError, match="same tokenizer"):
        evaluate_perplexity(m, torch.zeros(1, 3, dtype=torch.long), ["eng"], model_name="m",
                            teacher=Bigram(torch.zeros(3, 3)))


def test_tokens_to_reach_interpolates_first_crossing():
    tokens, loss = [0, 100, 200, 300], [5.0, 4.0, 3.0, 3.5]
    assert tokens_to_reach(tokens, loss, 3.5) == pytest.approx(150.0)
    assert tokens_to_reach(tokens, loss, 4.0) == pytest.approx(100.0)
    assert tokens_to_reach(tokens, loss, 6.0) == 0.0
    assert tokens_to_reach(tokens, loss, 2.0) is None
    assert tokens_to_reach([10, 20], [3.0, 1.0], 2.5) == pytest.approx(12.5)
    with pytest.raises(HybridlabError, match="strictly increasing"):
        tokens_to_reach([0, 0], [1.0, 0.5], 0.7)
    with pytest.raises(HybridlabError, match="NaN"):
        tokens_to_reach([0, 1], [1.0, float("nan")], 0.7)


def test_fraction_of_baseline_tokens():
    base_t, base_l = [0, 100, 200], [6.0, 4.0, 3.0]
    fast_t, fast_l = [0, 50, 100], [6.0, 3.5, 2.5]
    # target 3.0: baseline at 200; fast: between 50 (3.5) and 100 (2.5) -> 75
    assert fraction_of_baseline_tokens(fast_t, fast_l, base_t, base_l) == pytest.approx(75 / 200)
    assert fraction_of_baseline_tokens([0, 10], [6.0, 5.0], base_t, base_l) is None
    assert fraction_of_baseline_tokens(fast_t, fast_l, base_t, base_l, target_loss=4.0) == pytest.approx(
        (0 + (6.0 - 4.0) / (6.0 - 3.5) * 50) / 100)
    with pytest.raises(HybridlabError, match="never reaches"):
        fraction_of_baseline_tokens(fast_t, fast_l, base_t, base_l, target_loss=1.0)


def test_teacher_memo_reuses_the_teachers_hidden_states_and_changes_nothing():
    from tiny_models import tiny_qwen3

    def qwen(seed):
        return tiny_qwen3(seed=seed, vocab_size=50).eval()

    teacher, student = qwen(0), qwen(1)
    ids = torch.randint(0, 50, (5, 12), generator=torch.Generator().manual_seed(2))
    langs = ["eng_Latn", "eng_Latn", "fra_Latn", "fra_Latn", "fra_Latn"]
    calls = []
    teacher.model.register_forward_hook(lambda *a: calls.append(1))
    plain = evaluate_perplexity(student, ids, langs, model_name="s", teacher=teacher, batch_size=2)
    n_plain = len(calls)
    memo = {}
    first = evaluate_perplexity(student, ids, langs, model_name="s", teacher=teacher, batch_size=2, teacher_memo=memo)
    second = evaluate_perplexity(student, ids, langs, model_name="s", teacher=teacher, batch_size=2, teacher_memo=memo)
    assert n_plain == 3 and len(calls) == 2 * n_plain  # the second memo call never ran the teacher's decoder
    for t in (first, second):
        assert t["ce"].to_list() == plain["ce"].to_list() and t["kl"].to_list() == plain["kl"].to_list()
