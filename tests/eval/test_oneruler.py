"""OneRULER NIAH: its data layout, prompt assembly, two-key multi-query, scoring; chat templates; YaRN."""

import json
import re

import polars as pl
import pytest
import torch
from tiny_models import tiny_qwen3

from hybridlab.errors import HybridlabError
from hybridlab.eval import oneruler
from hybridlab.eval.niah import build_niah_example
from hybridlab.models.rope import apply_yarn
from hybridlab.rehearsal import REHEARSAL_ONERULER_PROMPTS, write_oneruler_layout


class CharTok:
    """One token per character; a chat template that wraps the user turn."""

    chat_template = "user-turn"

    def __call__(self, text, add_special_tokens=True, return_tensors=None):
        return {"input_ids": list(range(len(text) + (1 if add_special_tokens else 0)))}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return f"<|user|>{messages[0]['content']}<|assistant|>"


@pytest.fixture
def data(tmp_path):
    mono = pl.DataFrame({"doc_id": ["a", "b"], "lang": ["eng_Latn", "eng_Latn"],
                         "text": ["The sky is grey. Rain fell all day!", "Was it cold? It was."], "source": ["t", "t"]})
    write_oneruler_layout(mono, tmp_path / "or")
    return tmp_path / "or"


def test_load_language_reads_prompts_words_and_book_sentences(data):
    lang = oneruler.load_language(data, "eng_Latn")
    assert lang.code == "en" and lang.prompts == REHEARSAL_ONERULER_PROMPTS
    assert lang.words[:3] == ("apple", "river", "candle")
    assert lang.sentences == ("The sky is grey.", "Rain fell all day!", "Was it cold?", "It was.")
    assert lang.needle("apple", "1234567") == 'The special magic number for "apple" is: 1234567.'
    assert lang.none_words == ("none",)


def test_prompt_assembly_by_hand(data):
    lang = oneruler.load_language(data, "eng_Latn")
    p = REHEARSAL_ONERULER_PROMPTS
    want = (p["task"].replace("{context}", "CTX {x}") + p["question_multi_numbers"].format(query1="a", query2="b")
            + " " + p["please_list"] + " " + p["if_no_numbers"] + p["answer_prefix"] + " " + p["answer_numbers"])
    assert lang.prompt("CTX {x}", ["a", "b"]) == want  # braces in the haystack survive
    zh = oneruler.OneRulerLanguage("zh", p, ("k",), (), ("无",))
    assert zh.sep == "" and zh.needle("k", "1") .endswith("1。")


def test_missing_data_are_one_line_errors(data, tmp_path):
    with pytest.raises(HybridlabError, match="OneRULER has no tel_Telu"):
        oneruler.load_language(data, "tel_Telu")
    with pytest.raises(HybridlabError, match="mungg/OneRuler"):
        oneruler.load_language(tmp_path / "nowhere", "eng_Latn")
    (data / "prompt/en/niah.txt").write_text(json.dumps({"task": "{context}"}))
    with pytest.raises(HybridlabError, match="lack"):
        oneruler.load_language(data, "eng_Latn")


@pytest.mark.parametrize("prediction, answers, task, correct", [
    ("<Answer> 1234567, 7654321 </Answer>", ("7654321", "1234567"), "niah_multiquery", True),  # any order
    ("1234567 and 1234567", ("1234567",), "niah_single", True),  # duplicates count once
    ("1234567, 2222222", ("1234567",), "niah_single", False),  # an extra number fails
    ("1234567", ("1234567", "7654321"), "niah_multivalue", False),  # a missing one fails
    ("1234567 or none", ("1234567",), "niah_single", False),  # a none word fails a number task
    ("the answer 1234567 in 3 parts", ("1234567",), "niah_single", True),  # single digits are ignored
    ("１２３４５６７", ("1234567",), "niah_single", True),  # NFKC: full-width digits
    ("<Answer> None </Answer>", (), "niah_none", True),
    ("N o n e", (), "niah_none", True),  # spaces are removed before the match
    ("1234567", (), "niah_none", False),
])
def test_scoring_by_hand(prediction, answers, task, correct):
    assert oneruler.score_oneruler(prediction, answers, task, ("none",)) == (float(correct), correct)


def test_oneruler_examples_use_its_words_two_key_multiquery_and_chat_template(data):
    lang = oneruler.load_language(data, "eng_Latn")
    tok = CharTok()
    ex = build_niah_example(tok, lang.sentences, task="niah_multiquery", lang="eng_Latn", target_tokens=1200,
                            seed=0, oneruler=lang, chat=True)
    assert len(ex.answers) == 2 and ex.scoring == "oneruler" and ex.chat
    assert ex.prompt.startswith("<|user|>Read the text below") and ex.prompt.endswith("<|assistant|>")
    assert ex.context_tokens == len(ex.prompt) <= 1200  # counted without added special tokens
    assert ex.prompt.count("The special magic number for") == 2  # two needles, then the two-key question
    none = build_niah_example(tok, lang.sentences, task="niah_none", lang="eng_Latn", target_tokens=1200, seed=0,
                              oneruler=lang)
    assert none.answers == () and none.none_words == ("none",) and not none.chat


def _qwen(max_pos=64):
    return tiny_qwen3(seed=0, num_hidden_layers=1, max_position_embeddings=max_pos).eval()


def test_yarn_changes_only_the_rotary_embedding_and_records_its_factor():
    model, ref = _qwen(), _qwen()
    params = apply_yarn(model, 4.0)
    assert params["rope_type"] == "yarn" and params["factor"] == 4.0 and params["original_max_position_embeddings"] == 64
    assert model.config.max_position_embeddings == 256
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    ids = torch.arange(200)[None] % 64
    with torch.no_grad():
        assert (model(ids).logits - ref(ids).logits).abs().max() > 1e-3
    with pytest.raises(HybridlabError, match="> 1"):
        apply_yarn(_qwen(), 0.5)


def test_oneruler_none_task_has_four_distractors_in_contiguous_book_text(data):
    lang = oneruler.load_language(data, "eng_Latn")
    ex = build_niah_example(CharTok(), lang.sentences, task="niah_none", lang="eng_Latn", target_tokens=1500, seed=2,
                            oneruler=lang)
    assert ex.prompt.count("The special magic number for") == 4 and len(ex.needle_depths) == 4
    body = ex.prompt
    for i, s in enumerate(lang.sentences):  # the book's sentences in reading order, needles in between
        body = body.replace(s, f"[{i}]")
    idx = [int(i) for i in re.findall(r"\[(\d)\]", body)]
    assert len(idx) > 8 and all(b == (a + 1) % 4 for a, b in zip(idx, idx[1:]))
