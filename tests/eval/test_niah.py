import re

import pytest
import torch
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.eval.niah import (
    TASKS,
    NiahTemplate,
    build_niah_example,
    build_niah_suite,
    normalise,
    run_niah,
    score_prediction,
    summarise_niah,
)

HAYSTACK = [f"Sentence number {i} talks about the weather and the {w} in town." for i, w in
            enumerate(["market", "river", "school", "bridge", "garden", "station", "harbor"] * 3)]
NEEDLE_RE = re.compile(r"The special magic number for (\w+) is: (\d{7})\.")


class WordTokenizer:
    """Whitespace tokenizer with a growing vocabulary (1 token per word), enough for build and run."""

    pad_token_id, eos_token_id = 0, 0

    def __init__(self):
        self.vocab, self.words = {"<pad>": 0}, ["<pad>"]

    def _id(self, w):
        if w not in self.vocab:
            self.vocab[w] = len(self.words)
            self.words.append(w)
        return self.vocab[w]

    def __call__(self, text, return_tensors=None):
        ids = [self._id(w) for w in text.split()]
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}

    def decode(self, ids, skip_special_tokens=True):
        words = [self.words[int(i)] if int(i) < len(self.words) else f"<{int(i)}>" for i in ids]
        return " ".join(w for i, w in zip(ids, words) if not (skip_special_tokens and int(i) == 0))


@pytest.mark.parametrize("task", TASKS)
def test_each_task_has_its_needles_and_fits_the_target_length(task):
    tok = WordTokenizer()
    ex = build_niah_example(tok, HAYSTACK, task=task, lang="fra_Latn", target_tokens=300, seed=1)
    needles = NEEDLE_RE.findall(ex.prompt)
    asked = re.findall(r"numbers? for ([\w, ]+) mentioned", ex.prompt)[-1].split(", ")
    n_expected = {"niah_single": 1, "niah_multikey": 4, "niah_multivalue": 4, "niah_multiquery": 4, "niah_none": 3}
    assert len(needles) == n_expected[task]
    assert 300 - 14 < ex.context_tokens <= 300  # short by less than one haystack sentence (13 words)
    assert ex.context_tokens == len(tok(ex.prompt)["input_ids"]) and ex.target_tokens == 300
    assert ex.task == task and ex.lang == "fra_Latn" and 0.0 <= ex.depth <= 1.0
    values = dict(needles) if task != "niah_multivalue" else None
    if task == "niah_none":
        assert ex.answers == () and asked[0] not in {k for k, _ in needles}
    elif task == "niah_multivalue":
        assert {k for k, _ in needles} == set(asked) and sorted(ex.answers) == sorted(v for _, v in needles)
    else:
        assert list(ex.answers) == [values[k] for k in asked]
    assert all(len(v) == 7 for v in ex.answers)
    assert ex.prompt.rstrip().endswith("Answer:")


def test_examples_are_seeded_and_depth_controls_the_position():
    tok = WordTokenizer()
    a = build_niah_example(tok, HAYSTACK, task="niah_single", lang="x", target_tokens=200, seed=3)
    assert a == build_niah_example(tok, HAYSTACK, task="niah_single", lang="x", target_tokens=200, seed=3)
    assert a.prompt != build_niah_example(tok, HAYSTACK, task="niah_single", lang="x", target_tokens=200, seed=4).prompt
    first = build_niah_example(tok, HAYSTACK, task="niah_single", lang="x", target_tokens=200, seed=3, depth=0.0)
    last = build_niah_example(tok, HAYSTACK, task="niah_single", lang="x", target_tokens=200, seed=3, depth=1.0)
    body_first = first.prompt.split("\n\n")[1]
    body_last = last.prompt.split("\n\n")[1]
    assert body_first.startswith("The special magic number") and body_last.endswith(f"is: {last.answers[0]}.")


def test_long_target_cycles_the_haystack_and_short_target_is_an_error():
    tok = WordTokenizer()
    ex = build_niah_example(tok, HAYSTACK[:2], task="niah_single", lang="x", target_tokens=1000, seed=0)
    assert 1000 - 14 < ex.context_tokens <= 1000
    with pytest.raises(HybridlabError, match="shorter than the prompt"):
        build_niah_example(tok, HAYSTACK, task="niah_single", lang="x", target_tokens=20, seed=0)
    with pytest.raises(HybridlabError, match="unknown NIAH task"):
        build_niah_example(tok, HAYSTACK, task="niah_double", lang="x", target_tokens=200, seed=0)
    with pytest.raises(HybridlabError, match="no haystack"):
        build_niah_example(tok, ["  "], task="niah_single", lang="x", target_tokens=200, seed=0)


def test_scoring_edge_cases():
    assert normalise(" The Answer: 1,234-567! ") == "theanswer1234567"
    assert score_prediction("1234567", ["1234567"], "niah_single") == (1.0, True)
    assert score_prediction("It is 1 234 567.", ["1234567"], "niah_single") == (1.0, True)
    assert score_prediction("7654321", ["1234567"], "niah_single") == (0.0, False)
    assert score_prediction("1111111 and 2222222", ["1111111", "2222222", "3333333"], "niah_multivalue") == (
        pytest.approx(2 / 3), False)
    assert score_prediction("3333333, 2222222, 1111111", ["1111111", "2222222", "3333333"], "niah_multiquery") == (
        1.0, True)
    assert score_prediction("None.", [], "niah_none") == (1.0, True)
    assert score_prediction("none, maybe 1234567", [], "niah_none") == (0.0, False)
    assert score_prediction("I cannot find it", [], "niah_none") == (0.0, False)
    assert score_prediction("aucun", [], "niah_none", none_word="aucun") == (1.0, True)


class Oracle(nn.Module):
    """Reads the needles from the prompt and answers them; raises OOM above `oom_above` tokens."""

    def __init__(self, tok, oom_above=None):
        super().__init__()
        self.tok, self.oom_above = tok, oom_above
        self.p = nn.Parameter(torch.zeros(1))
        self.calls = 0

    def generate(self, input_ids, max_new_tokens, **kwargs):
        self.calls += 1
        if self.oom_above is not None and input_ids.shape[1] > self.oom_above:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        prompt = self.tok.decode(input_ids[0])
        table = {}
        for k, v in NEEDLE_RE.findall(prompt):
            table.setdefault(k, []).append(v)
        asked = re.findall(r"numbers? for ([\w, ]+) mentioned", prompt)[-1].split(", ")
        found = [v for k in asked for v in table.get(k, [])]
        answer = " , ".join(found) if found else "none"
        ids = torch.tensor([[self.tok._id(w) for w in answer.split()]])
        return torch.cat([input_ids, ids], dim=1)


def test_run_niah_oracle_scores_every_task_correct():
    tok = WordTokenizer()
    examples = build_niah_suite(tok, {"fra_Latn": HAYSTACK, "deu_Latn": HAYSTACK[::-1]}, lengths=[150, 250],
                                n_per_cell=1, seed=0)
    assert len(examples) == 2 * len(TASKS) * 2
    df = run_niah(Oracle(tok), tok, examples, max_new_tokens=16)
    assert df.height == len(examples)
    assert df["correct"].all() and not df["oom"].any()
    assert df["memory_kind"].unique().to_list() == ["cpu_peak_rss"] and df["peak_memory_bytes"].min() > 0
    summary = summarise_niah(df)
    assert summary.height == 2 * len(TASKS) * 2 and summary["accuracy"].min() == 1.0


def test_run_niah_records_oom_frees_and_continues():
    tok = WordTokenizer()
    examples = [build_niah_example(tok, HAYSTACK, task="niah_single", lang="x", target_tokens=n, seed=s)
                for n, s in [(150, 0), (400, 1), (600, 2), (150, 3)]]
    model = Oracle(tok, oom_above=300)
    df = run_niah(model, tok, examples, max_new_tokens=8)
    assert df["oom"].to_list() == [False, True, True, False]
    assert df["skipped"].to_list() == [False, False, True, False]  # 600 >= the 400 that OOMed: not run
    assert df["correct"].to_list() == [True, False, False, True]
    assert model.calls == 3
    again = run_niah(Oracle(tok, oom_above=300), tok, examples, max_new_tokens=8, skip_longer_after_oom=False)
    assert again["skipped"].to_list() == [False] * 4 and again["oom"].to_list() == [False, True, True, False]


def test_run_niah_with_a_real_tiny_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = WordTokenizer()
    ex = build_niah_example(tok, HAYSTACK, task="niah_none", lang="x", target_tokens=120, seed=0,
                            template=NiahTemplate(none_word="aucun"))
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok.words) + 8, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                         intermediate_size=64))
    df = run_niah(model, tok, [ex], max_new_tokens=3)
    row = df.to_dicts()[0]
    assert len(row["prediction"].split()) <= 3 and row["seconds"] > 0 and row["peak_memory_bytes"] > 0
    assert row["correct"] == ("aucun" in row["prediction"] and not re.search(r"\d", row["prediction"]))
