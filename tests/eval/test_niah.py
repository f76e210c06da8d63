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
    chat_prompt,
    native_window_of,
    normalise,
    run_niah,
    score_prediction,
    summarise_niah,
    template_takes_thinking,
    yarn_for,
)
from hybridlab.eval.pairs import AnalysisModel

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
    n_expected = {"niah_single": 1, "niah_multikey": 4, "niah_multivalue": 4, "niah_multiquery": 4, "niah_none": 4}
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
    # an OOM is its own outcome: no prediction, score or correctness
    assert df["correct"].to_list() == [True, None, None, True] and df["score"].to_list()[1:3] == [None, None]
    assert model.calls == 3
    again = run_niah(Oracle(tok, oom_above=300), tok, examples, max_new_tokens=8, skip_longer_after_oom=False)
    assert again["skipped"].to_list() == [False] * 4 and again["oom"].to_list() == [False, True, True, False]


def test_run_niah_with_a_real_tiny_model():
    from tiny_models import tiny_qwen3

    tok = WordTokenizer()
    ex = build_niah_example(tok, HAYSTACK, task="niah_none", lang="x", target_tokens=120, seed=0,
                            template=NiahTemplate(none_word="aucun"))
    model = tiny_qwen3(seed=0, vocab_size=len(tok.words) + 8, num_hidden_layers=1)
    df = run_niah(model, tok, [ex], max_new_tokens=3)
    row = df.to_dicts()[0]
    assert len(row["prediction"].split()) <= 3 and row["seconds"] > 0 and row["peak_memory_bytes"] > 0
    assert row["correct"] == ("aucun" in row["prediction"] and not re.search(r"\d", row["prediction"]))


def test_niah_none_has_four_distractors_none_with_the_asked_key():
    tok = WordTokenizer()
    for seed in range(5):
        ex = build_niah_example(tok, HAYSTACK, task="niah_none", lang="x", target_tokens=400, seed=seed)
        needles = NEEDLE_RE.findall(ex.prompt)
        asked = re.findall(r"number for (\w+) mentioned", ex.prompt)[-1]
        assert len(needles) == 4 and len({k for k, _ in needles}) == 4 and asked not in {k for k, _ in needles}
        assert len(ex.needle_depths) == 4 and ex.answers == ()


NUMBERED = [f"Line {i} of the book ends here." for i in range(40)]


def _haystack_indices(prompt):
    body = NEEDLE_RE.sub("", prompt.split("\n\n")[1])
    return [int(i) for i in re.findall(r"Line (\d+) of the book", body)]


def test_haystack_is_contiguous_text_from_a_seeded_start():
    tok = WordTokenizer()
    starts = set()
    for seed in range(6):
        ex = build_niah_example(tok, NUMBERED, task="niah_multikey", lang="x", target_tokens=250, seed=seed)
        idx = _haystack_indices(ex.prompt)
        assert len(idx) > 10
        assert all(b == (a + 1) % len(NUMBERED) for a, b in zip(idx, idx[1:]))  # consecutive sentences
        starts.add(idx[0])
    assert len(starts) > 1  # the start is drawn per example
    # shorter than the context: the text wraps around to its beginning, still in order
    ex = build_niah_example(tok, NUMBERED[:5], task="niah_single", lang="x", target_tokens=250, seed=0)
    idx = _haystack_indices(ex.prompt)
    assert len(idx) > 5 and all(b == (a + 1) % 5 for a, b in zip(idx, idx[1:]))


def _oom_rows():
    """Hand-made run_niah rows of one cell: 2 of 3 completed examples correct, 2 OOM."""
    import polars as pl

    from hybridlab.eval.niah import ROW_SCHEMA

    base = dict(task="niah_single", lang="x", target_tokens=100, context_tokens=98, depth=0.5, skipped=False,
                yarn_factor=None, seconds=0.1, peak_memory_bytes=10, memory_kind="cpu_peak_rss")
    rows = [base | dict(prediction="1", score=1.0, correct=True, oom=False),
            base | dict(prediction="1", score=1.0, correct=True, oom=False),
            base | dict(prediction="2", score=0.0, correct=False, oom=False),
            base | dict(prediction=None, score=None, correct=None, oom=True),
            base | dict(prediction=None, score=None, correct=None, oom=True, skipped=True)]
    return pl.DataFrame(rows, schema=ROW_SCHEMA)


def test_accuracy_is_over_completed_examples_and_oom_is_counted_apart():
    s = summarise_niah(_oom_rows()).row(0, named=True)
    assert s["n"] == 3 and s["n_oom"] == 2 and s["oom_rate"] == pytest.approx(0.4)
    assert s["accuracy"] == pytest.approx(2 / 3) and s["score"] == pytest.approx(2 / 3)  # not 2 / 5
    # even rows that say correct=False on an OOM (older tables) are left out of the accuracy
    import polars as pl

    legacy = _oom_rows().with_columns(correct=pl.col("correct").fill_null(False), score=pl.col("score").fill_null(0.0))
    assert summarise_niah(legacy)["accuracy"][0] == pytest.approx(2 / 3)
    # a cell where every example ran out of memory has no accuracy
    allout = summarise_niah(_oom_rows().filter(pl.col("oom"))).row(0, named=True)
    assert allout["n"] == 0 and allout["n_oom"] == 2 and allout["accuracy"] is None


class TemplateTok:
    """A tokenizer stub with a chat template source; a strict apply_chat_template that rejects kwargs it
    does not know, as a template without the variable might."""

    def __init__(self, template, accepts_thinking):
        self.chat_template, self.accepts, self.calls = template, accepts_thinking, []

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs):
        if kwargs and not self.accepts:
            raise TypeError(f"unexpected {sorted(kwargs)}")
        self.calls.append(kwargs)
        think = "<think></think>" if kwargs.get("enable_thinking") is False else ""
        return f"<u>{messages[0]['content']}<a>{think}"


def test_enable_thinking_false_is_passed_only_to_templates_that_read_it():
    qwen = TemplateTok("{%- if enable_thinking is defined and enable_thinking is false %}...{%- endif %}", True)
    other = TemplateTok("{{ messages[0]['content'] }}", False)
    assert template_takes_thinking(qwen) and not template_takes_thinking(other)
    assert template_takes_thinking(TemplateTok({"default": "x enable_thinking y", "tool_use": "z"}, True))
    assert chat_prompt(qwen, "hi") == "<u>hi<a><think></think>" and qwen.calls == [{"enable_thinking": False}]
    assert chat_prompt(other, "hi") == "<u>hi<a>" and other.calls == [{}]  # no unknown kwarg, no error


def test_enable_thinking_reaches_a_real_jinja_template():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")))
    tok.chat_template = ("{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
                         "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}")
    assert chat_prompt(tok, "hi") == "<|user|>hi<|assistant|><think></think>"
    tok.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    assert chat_prompt(tok, "hi") == "<|user|>hi<|assistant|>"


def test_yarn_applies_only_past_the_native_window():
    assert yarn_for(32768, 4.0, 32768) is None and yarn_for(32769, 4.0, 32768) == 4.0
    assert yarn_for(131072, 4.0, 131072) is None  # a 128K model at 128K keeps its RoPE
    assert yarn_for(8192, 4.0, None) == 4.0  # no window given: every cell, as before
    assert yarn_for(10**6, None, 32768) is None


def _tiny_qwen(tok, max_pos=512):
    from tiny_models import tiny_qwen3_config
    from transformers import Qwen3ForCausalLM

    class Recording(Qwen3ForCausalLM):
        seen: list = []

        def generate(self, *args, **kwargs):
            rotary = self.get_decoder().rotary_emb
            self.seen.append((rotary.rope_type, rotary.config.rope_parameters.get("original_max_position_embeddings")))
            return super().generate(*args, **kwargs)

    torch.manual_seed(0)
    model = Recording(tiny_qwen3_config(vocab_size=len(tok.words) + 400, num_hidden_layers=1,
                                        max_position_embeddings=max_pos))
    model.seen = []
    return model


def test_run_niah_scales_rope_only_for_cells_past_the_native_window_and_restores_it():
    tok = WordTokenizer()
    examples = [build_niah_example(tok, HAYSTACK, task="niah_single", lang="x", target_tokens=n, seed=0)
                for n in (150, 300, 150)]
    model = _tiny_qwen(tok)
    native_rotary = model.get_decoder().rotary_emb
    df = run_niah(model, tok, examples, max_new_tokens=2, yarn_factor=4.0, native_window=200)
    assert df["yarn_factor"].to_list() == [None, 4.0, None]
    assert model.seen == [("default", None), ("yarn", 200), ("default", None)]
    assert model.get_decoder().rotary_emb is native_rotary and model.config.max_position_embeddings == 512
    # no window: every example over the config's window (the behaviour of presets without native_window)
    model.seen = []
    df = run_niah(model, tok, examples, max_new_tokens=2, yarn_factor=4.0)
    assert df["yarn_factor"].to_list() == [4.0] * 3 and model.seen == [("yarn", 512)] * 3
    assert run_niah(model, tok, examples[:1], max_new_tokens=2)["yarn_factor"].to_list() == [None]


def test_native_window_from_the_config_key_the_teacher_or_the_model_config():
    model = _tiny_qwen(WordTokenizer(), max_pos=40960)
    windows = {"Qwen/Qwen3-4B": 32768, "org/hub-hybrid": 131072}
    teacher = AnalysisModel("Qwen/Qwen3-4B", "p", "t", {"Qwen/Qwen3-4B/sandwich-gdn": "dense"})
    student = AnalysisModel("Qwen/Qwen3-4B/sandwich-gdn", "p", "t", {"Qwen/Qwen3-4B/sandwich-gdn": "hybrid"})
    hub = AnalysisModel("org/hub-hybrid", "p", "t", {"hub": "hybrid"}, hub=True)
    other = AnalysisModel("org/other", "p", "t", {"hub": "dense"}, hub=True)
    assert native_window_of(teacher, model, windows) == 32768  # the key beats the config's 40960
    assert native_window_of(student, model, windows) == 32768  # a distilled student takes its teacher's
    assert native_window_of(hub, model, windows) == 131072
    assert native_window_of(other, model, windows) == 40960  # not listed: its config
    assert native_window_of(teacher, model, None) is None  # key absent: scale every cell


def test_niah_tables_count_oom_apart_and_record_the_window_and_factor(monkeypatch):
    import polars as pl

    from hybridlab.eval import niah

    mono, params = _split_setup(monkeypatch, tasks=["niah_single"], yarn_factor=2.0, native_window={"t": 200})
    examples, summary = niah.niah_tables(mono, params, device="cpu", log=lambda *_: None)
    by = {(r["model"], r["context_tokens"]): r for r in summary.iter_rows(named=True)}
    dense_long = by["t", 300]
    assert dense_long["n"] == 0 and dense_long["n_oom"] == 2 and dense_long["accuracy"] is None
    assert dense_long["oom"] and dense_long["oom_rate"] == 1.0
    assert by["t", 150]["n"] == 2 and by["t", 150]["accuracy"] == 1.0 and by["t", 150]["n_oom"] == 0
    # the student takes its teacher's window; the Oracle has no RoPE to scale
    assert by["t/sp-gdn", 150]["native_window"] == 200 and by["t/sp-gdn", 150]["yarn_factor"] is None
    assert by["t/sp-gdn", 300]["yarn_factor"] == 2.0 and by["t", 300]["yarn_factor"] is None
    assert summary.columns[-7:] == ["n_oom", "oom_rate", "native_window", "prompts", "chat_template", "yarn_factor",
                                    "memory_cap_gib"]
    assert summary["memory_cap_gib"].is_null().all()  # CPU: no cap applied
    assert examples.columns[:7] == ["model", "pair", "role", "prompts", "chat_template", "yarn_factor", "native_window"]
    assert examples.filter(pl.col("oom"))["correct"].null_count() == 2


def _split_setup(monkeypatch, **niah):
    """(mono, params) of a two-model NIAH run (a tiny Qwen3 student, an Oracle teacher that runs out of memory
    above 200 tokens); `niah` replaces keys of its niah section."""
    import polars as pl

    from hybridlab.eval import pairs

    class Tok(WordTokenizer):
        def __call__(self, text, return_tensors=None, add_special_tokens=True):
            return super().__call__(text, return_tensors)

    tok = Tok()
    models = {"t/sp-gdn": _tiny_qwen(tok), "t": Oracle(tok, oom_above=200)}
    monkeypatch.setattr(pairs, "load_analysis_model", lambda m, **kw: (models[m.name], tok))
    mono = pl.DataFrame({"doc_id": ["a"], "lang": ["eng_Latn"], "text": [" ".join(HAYSTACK)], "source": ["t"]})
    params = {"seed": 0, "dtype": "float32", "english": "eng_Latn", "models": {"distilled": [dict(teacher="t", teacher_path="x", student="sp-gdn",
                                                                       student_path="y", tokenizer="z")]},
              "niah": {"languages": ["eng_Latn"], "tasks": ["niah_single", "niah_none"], "context_tokens": [150, 300],
                       "examples_per_cell": 2, "answer_slack_tokens": 2, **niah}}
    return mono, params


def test_per_model_jobs_gathered_equal_one_job_over_every_model(monkeypatch, tmp_path):
    """eval_niah runs one model per job; gather_niah gives the tables (columns, rows) of one job over all."""
    import polars as pl

    from hybridlab.eval import niah

    mono, params = _split_setup(monkeypatch)
    quiet = dict(device="cpu", log=lambda *_: None)
    examples, summary = niah.niah_tables(mono, params, **quiet)
    paths = []
    for name in ("t/sp-gdn", "t"):  # the per-model jobs
        paths.append(tmp_path / f"{name.replace('/', '--')}.parquet")
        niah.niah_model_examples(mono, params, name, **quiet).write_parquet(paths[-1])
    g_examples, g_summary = niah.gather_niah(paths, log=lambda *_: None)
    timing = ["seconds", "peak_memory_bytes"]
    assert g_examples.schema == examples.schema and g_summary.schema == summary.schema
    assert g_examples.drop(timing).equals(examples.drop(timing))
    assert g_summary.drop(timing).equals(summary.drop(timing))
    pl.DataFrame({"x": [1]}).write_parquet(tmp_path / "bad.parquet")
    with pytest.raises(HybridlabError, match="bad.parquet has other columns"):
        niah.gather_niah([paths[0], tmp_path / "bad.parquet"])


def test_a_rerun_reuses_the_tasks_a_killed_job_finished(monkeypatch, tmp_path):
    from hybridlab.eval import niah

    mono, params = _split_setup(monkeypatch)
    first = niah.niah_model_examples(mono, params, "t", device="cpu", work=tmp_path, log=lambda *_: None)
    (work,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    assert sorted(p.name for p in work.glob("task-*.parquet")) == ["task-niah_none.parquet", "task-niah_single.parquet"]
    (work / "task-niah_none.parquet").unlink()  # killed during the second task
    ran = []
    real = niah.run_niah
    monkeypatch.setattr(niah, "run_niah", lambda m, t, exs, *a, **k: ran.append(exs[0].task) or real(m, t, exs, *a, **k))
    again = niah.niah_model_examples(mono, params, "t", device="cpu", work=tmp_path, log=lambda *_: None)
    assert ran == ["niah_none"]  # the finished task is read back, not decoded again
    assert again.drop("seconds", "peak_memory_bytes").equals(first.drop("seconds", "peak_memory_bytes"))
    with pytest.raises(HybridlabError, match="'nope' is not among the analysis models"):
        niah.niah_model_examples(mono, params, "nope", device="cpu", log=lambda *_: None)


def test_memory_cap_sets_the_cuda_fraction_and_records_the_cap(monkeypatch):
    """cap / device memory goes to set_per_process_memory_fraction; a cap above the device is the device's."""
    from types import SimpleNamespace

    from hybridlab.eval.niah import apply_memory_cap

    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(total_memory=160 * 2 ** 30))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, dev: calls.append((f, dev.type)))
    assert apply_memory_cap(40.0, "cuda:0") == pytest.approx(40.0)
    assert apply_memory_cap(200.0, "cuda:0") == pytest.approx(160.0)
    assert calls == [(0.25, "cuda"), (1.0, "cuda")]
    assert apply_memory_cap(None, "cuda:0") is None and apply_memory_cap(40.0, "cpu") is None
    assert len(calls) == 2  # neither touches the allocator
    with pytest.raises(HybridlabError, match="memory_cap_gib must be > 0"):
        apply_memory_cap(0.0, "cuda:0")
