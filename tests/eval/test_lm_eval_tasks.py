"""lm-eval wrapper: task sets, RULER grid and calls, recall prompts and scoring, the local task end to end."""

import json
import math
import sys
import types

import polars as pl
import pytest

from hybridlab.errors import HybridlabError
from hybridlab.eval import lm_eval as wrapper
from hybridlab.eval.lm_eval import LMEvalConfig, build_arguments, evaluation_runs, ruler_pairs
from hybridlab.eval.lm_eval_tasks import TASKS_DIR, utils
from hybridlab.eval.lm_eval_tasks.local import LOCAL_TASK, local_recall_rows, write_local_task

# ---- task sets and the RULER grid --------------------------------------------------------------------------------


def test_paper_task_set_has_the_six_recall_tasks_and_project_configs_for_the_three_upstream_lacks():
    assert set(wrapper.RECALL_TASKS) == {"swde", "fda", "squad_completion", "based_triviaqa", "based_drop",
                                         "based_nq"}
    assert set(wrapper.PAPER_TASKS) == set(wrapper.STANDARD_TASKS) | set(wrapper.RECALL_TASKS)
    import yaml

    for task, dataset in (("based_triviaqa", "hazyresearch/based_triviaqa"), ("based_drop", "hazyresearch/based_drop"),
                          ("based_nq", "hazyresearch/based_nq_2048")):
        text = (TASKS_DIR / f"{task}.yaml").read_text()
        cfg = yaml.safe_load(text.replace("!function ", ""))  # the tag is lm-eval's; plain strings here
        assert cfg["task"] == task and cfg["dataset_path"] == dataset and cfg["validation_split"] == "validation"
        assert cfg["metric_list"] == [{"metric": "contains", "aggregation": "mean", "higher_is_better": True}]
        assert cfg["generation_kwargs"]["until"] == ["\n"]


def test_default_ruler_grid_is_13_tasks_by_5_lengths():
    pairs = ruler_pairs(LMEvalConfig())
    assert len(pairs) == 65 and len(set(pairs)) == 65
    assert {n for _, n in pairs} == {1024, 2048, 4096, 8192, 16384} and len({t for t, _ in pairs}) == 13


def test_excluded_pairs_leave_the_grid_and_split_the_calls_by_length_set():
    cfg = LMEvalConfig(tasks=("piqa",), ruler_tasks=("niah_single_1", "ruler_qa_squad", "ruler_vt"),
                       ruler_lengths=(4096, 1024, 2048), ruler_exclude=("ruler_qa_squad@1024", "ruler_vt@1024"))
    assert ruler_pairs(cfg) == [("niah_single_1", 1024), ("niah_single_1", 2048), ("niah_single_1", 4096),
                                ("ruler_qa_squad", 2048), ("ruler_qa_squad", 4096), ("ruler_vt", 2048),
                                ("ruler_vt", 4096)]
    runs = evaluation_runs(cfg, tokenizer_name="tok")
    assert runs == [{"tasks": ["piqa"], "metadata": {}},
                    {"tasks": ["niah_single_1"], "metadata": {"max_seq_lengths": [1024, 2048, 4096], "tokenizer": "tok"}},
                    {"tasks": ["ruler_qa_squad", "ruler_vt"],
                     "metadata": {"max_seq_lengths": [2048, 4096], "tokenizer": "tok"}}]


def test_arguments():
    hflm, ev = build_arguments(LMEvalConfig(ruler_lengths=(4096, 1024), batch_size=2, limit=10))
    assert hflm == {"batch_size": 2, "max_length": 4096} and ev["limit"] == 10 and ev["log_samples"] is False
    hflm, ev = build_arguments(LMEvalConfig(tasks=("piqa",), ruler_lengths=()))
    assert "max_length" not in hflm and ev["random_seed"] == 1234
    assert evaluation_runs(LMEvalConfig(tasks=("piqa",), ruler_lengths=()), tokenizer_name="x") == [
        {"tasks": ["piqa"], "metadata": {}}]


@pytest.mark.parametrize("kwargs, match", [
    ({"ruler_tasks": ("niah_single_9",)}, "unknown RULER task"),
    ({"ruler_exclude": ("niah_single_1-1024",)}, "is not 'task@length'"),
    ({"ruler_exclude": ("niah_single_1@3000",)}, "not in the RULER grid"),
    ({"ruler_lengths": (0,)}, "must be positive"),
    ({"tasks": (), "ruler_lengths": ()}, "no tasks and no RULER pairs"),
])
def test_bad_configs_are_one_line(kwargs, match):
    with pytest.raises(HybridlabError, match=match) as info:
        LMEvalConfig(**kwargs)
    assert "\n" not in str(info.value)


# ---- recall prompts and scoring ----------------------------------------------------------------------------------


def test_contains_score():
    assert utils.contains(" Paris, France\n", ["paris"]) == 1.0
    assert utils.contains("London", ["Paris", "Lyon"]) == 0.0
    assert utils.contains("anything", ["", "  "]) == 0.0 and utils.contains("x", []) == 0.0
    assert utils.process_results({"answers": ["1912", "April 1912"]}, ["it sank in 1912."]) == {"contains": 1.0}


def test_cloze_prompt_drops_a_repeated_question_and_triviaqa_markers():
    doc = {"context": "The Titanic sank in 1912. When did it sink? ", "question": "When did it sink?",
           "answers": ["1912"]}
    assert utils.doc_to_text(doc) == "The Titanic sank in 1912. When did it sink?"
    tqa = {"context": "[DOC] [TLE] Titanic [PAR] It sank in 1912.", "question": "The Titanic sank in",
           "answers": ["1912"]}
    assert utils.doc_to_text_triviaqa(tqa) == "Titanic  It sank in 1912. The Titanic sank in"
    assert utils.doc_to_target(doc) == "1912" and utils.doc_to_target({"answers": []}) == "unanswerable"


def test_local_rows_are_deterministic_and_answerable_from_their_context():
    rows = local_recall_rows(12, seed=3)
    assert rows == local_recall_rows(12, seed=3) and rows != local_recall_rows(12, seed=4)
    for r in rows:
        key = r["question"].removeprefix("The code of ").removesuffix(" is")
        assert f"The code of {key} is {r['answers'][0]}." in r["context"]
        assert utils.contains(r["answers"][0], r["answers"]) == 1.0
    with pytest.raises(HybridlabError, match="facts"):
        local_recall_rows(2, facts=99)


def test_local_task_files(tmp_path):
    out = write_local_task(tmp_path / "t", n=5)
    lines = (out / f"{LOCAL_TASK}.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == local_recall_rows(5)
    text = (out / f"{LOCAL_TASK}.yaml").read_text()
    assert "dataset_path: json" in text and json.dumps(str(out / f"{LOCAL_TASK}.jsonl")) in text


# ---- the wrapper around lm-eval (a stand-in lm_eval module) -------------------------------------------------------


def _fake_lm_eval(monkeypatch, evaluate):
    calls = {"evaluate": [], "managers": []}
    names = ("lm_eval", "lm_eval.models", "lm_eval.models.huggingface", "lm_eval.tasks")
    pkg, models, hf, tasks = (types.ModuleType(n) for n in names)

    class HFLM:
        def __init__(self, pretrained, tokenizer, **kw):
            calls["hflm"] = (pretrained, tokenizer, kw)

    class TaskManager:
        def __init__(self, **kw):
            calls["managers"].append(kw)

    def simple_evaluate(model, **kw):
        calls["evaluate"].append(kw)
        return evaluate(kw)

    hf.HFLM, tasks.TaskManager, pkg.simple_evaluate = HFLM, TaskManager, simple_evaluate
    pkg.models, pkg.tasks, models.huggingface = models, tasks, hf
    for name, mod in zip(names, (pkg, models, hf, tasks)):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def test_results_become_tidy_rows_with_ruler_and_recall_means(monkeypatch):
    recall = {t: {"alias": t, "contains,none": 0.1 * (i + 1), "contains_stderr,none": 0.01}
              for i, t in enumerate(wrapper.RECALL_TASKS)}

    def evaluate(kw):
        if "niah_single_1" in kw["tasks"]:  # RULER reports -1 at a length it has no sample for
            return {"results": {"niah_single_1": {"1024,none": 0.5, "2048,none": 0.25, "4096,none": -1},
                                "ruler_vt": {"1024,none": 1.0, "2048,none": 0.75, "4096,none": -1}}}
        return {"results": {"piqa": {"alias": "piqa", "acc,none": 0.6, "acc_stderr,none": 0.01,
                                     "acc_norm,none": 0.62, "acc_norm_stderr,none": "N/A"}, **recall}}

    calls = _fake_lm_eval(monkeypatch, evaluate)
    model, tok = object(), object()
    cfg = LMEvalConfig(tasks=("piqa", *wrapper.RECALL_TASKS), ruler_tasks=("niah_single_1", "ruler_vt"),
                       ruler_lengths=(1024, 2048))
    df = wrapper.run_lm_eval(model, tok, cfg, tokenizer_name="tokdir", model_name="kda-bld")
    assert calls["hflm"][0] is model and calls["hflm"][1] is tok and calls["hflm"][2]["max_length"] == 2048
    assert [c["tasks"] for c in calls["evaluate"]] == [["piqa", *wrapper.RECALL_TASKS], ["niah_single_1", "ruler_vt"]]
    assert calls["managers"][1]["metadata"] == {"max_seq_lengths": [1024, 2048], "tokenizer": "tokdir"}
    assert calls["managers"][0]["include_defaults"] is True and str(TASKS_DIR) in calls["managers"][0]["include_path"]
    rows = {(t, m): (v, s) for _, t, m, _, v, s in df.rows()}
    assert rows[("piqa", "acc")] == (0.6, 0.01) and rows[("piqa", "acc_norm")] == (0.62, None)
    assert ("niah_single_1", "4096") not in rows  # the -1 marker is not a score
    assert rows[("ruler", "mean")][0] == pytest.approx((0.5 + 0.25 + 1.0 + 0.75) / 4)
    assert rows[("ruler", "pairs")][0] == 4.0
    assert rows[("ruler", "1024")][0] == pytest.approx(0.75) and rows[("ruler", "2048")][0] == pytest.approx(0.5)
    assert rows[("recall", "mean")][0] == pytest.approx(0.35)
    assert df.schema == pl.Schema(wrapper.ROW_SCHEMA)


def test_a_missing_ruler_pair_is_one_line(monkeypatch):
    _fake_lm_eval(monkeypatch, lambda kw: {"results": {"niah_single_1": {"1024,none": 0.5, "2048,none": -1}}})
    cfg = LMEvalConfig(tasks=(), ruler_tasks=("niah_single_1",), ruler_lengths=(1024, 2048))
    with pytest.raises(HybridlabError, match=r"1 RULER pair\(s\) missing.*niah_single_1@2048") as info:
        wrapper.run_lm_eval(object(), object(), cfg, tokenizer_name="t", model_name="m")
    assert "\n" not in str(info.value)


def test_not_installed_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # makes `import lm_eval` raise ImportError
    with pytest.raises(HybridlabError, match="lm-eval is not installed") as info:
        wrapper.run_lm_eval(object(), object(), LMEvalConfig(), tokenizer_name="t", model_name="m")
    assert "\n" not in str(info.value) and "pip install" in str(info.value)


def test_offline_is_one_line(monkeypatch):
    def offline(kw):
        try:
            raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (LocalEntryNotFoundError)")
        except ConnectionError as exc:
            raise RuntimeError("task setup failed") from exc

    _fake_lm_eval(monkeypatch, offline)
    with pytest.raises(HybridlabError, match="offline or unreachable hub") as info:
        wrapper.run_lm_eval(object(), object(), LMEvalConfig(), tokenizer_name="t", model_name="m")
    assert "\n" not in str(info.value)


# ---- the real lm-eval on the local task, with a tiny random model (no network) ------------------------------------


def _char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def test_local_task_end_to_end_with_a_tiny_random_model(monkeypatch):
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'lm-eval[hf]')")
    import torch
    from tiny_models import tiny_qwen3

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")  # the local task needs no network
    torch.manual_seed(0)
    tok = _char_tokenizer()
    model = tiny_qwen3(vocab_size=len(tok), max_position_embeddings=512, pad_token_id=0, eos_token_id=1,
                       bos_token_id=1).eval()
    cfg = LMEvalConfig(tasks=(LOCAL_TASK,), ruler_lengths=(), max_length=512)
    df = wrapper.run_lm_eval(model, tok, cfg, tokenizer_name="unused", model_name="tiny")
    assert df.filter(pl.col("task") == LOCAL_TASK)["metric"].to_list() == ["contains"]
    value = df.filter(pl.col("task") == LOCAL_TASK)["value"].item()
    assert math.isfinite(value) and 0.0 <= value <= 1.0


def test_ruler_samples_run_one_call_per_length_with_that_limit():
    cfg = LMEvalConfig(tasks=("piqa",), ruler_tasks=("niah_single_1", "ruler_vt"), ruler_lengths=(2048, 1024),
                       ruler_samples=50)
    runs = evaluation_runs(cfg, tokenizer_name="tok")
    assert runs[0] == {"tasks": ["piqa"], "metadata": {}}
    assert runs[1:] == [{"tasks": ["niah_single_1", "ruler_vt"], "metadata": {"max_seq_lengths": [n], "tokenizer": "tok"},
                         "limit": 50} for n in (1024, 2048)]


def test_a_rerun_reuses_finished_calls_and_merges_ruler_lengths(monkeypatch, tmp_path):
    def evaluate(kw):
        if kw["tasks"] == ["piqa"]:
            return {"results": {"piqa": {"acc,none": 0.6, "acc_stderr,none": 0.01}}}
        assert kw["limit"] == 3
        n = kw["task_manager"].kw["metadata"]["max_seq_lengths"][0]  # RULER: -1 / N/A at the other length
        other = 3072 - n
        return {"results": {"niah_single_1": {f"{n},none": n / 4096, f"{n}_stderr,none": 0.1,
                                              f"{other},none": -1, f"{other}_stderr,none": "N/A"}}}

    calls = _fake_lm_eval(monkeypatch, evaluate)
    import lm_eval.tasks

    class Manager:
        def __init__(self, **kw):
            self.kw = kw

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Manager)
    cfg = LMEvalConfig(tasks=("piqa",), ruler_tasks=("niah_single_1",), ruler_lengths=(1024, 2048), ruler_samples=3)
    first = wrapper.run_lm_eval(object(), object(), cfg, tokenizer_name="tok", model_name="m", work=tmp_path)
    rows = {(t, m): (v, s) for _, t, m, _, v, s in first.rows()}
    assert rows[("niah_single_1", "1024")] == (0.25, 0.1) and rows[("niah_single_1", "2048")] == (0.5, 0.1)
    assert len(calls["evaluate"]) == 3 and len(list(tmp_path.glob("call-*.json"))) == 3
    sorted(tmp_path.glob("call-*.json"))[0].unlink()  # one call lost with a killed job
    again = wrapper.run_lm_eval(object(), object(), cfg, tokenizer_name="tok", model_name="m", work=tmp_path)
    assert len(calls["evaluate"]) == 4 and again.equals(first)


def test_gathered_table_keeps_the_schema_and_the_model_order(tmp_path):
    paths = []
    for name in ("b", "a"):
        paths.append(tmp_path / f"{name}.parquet")
        pl.DataFrame([{"model": name, "task": "piqa", "metric": "acc", "filter": "none", "value": 0.5, "stderr": None}],
                     schema=wrapper.ROW_SCHEMA).write_parquet(paths[-1])
    table = wrapper.gather_tables(paths)
    assert table.schema == pl.Schema(wrapper.ROW_SCHEMA) and table["model"].to_list() == ["b", "a"]
    pl.DataFrame({"model": ["c"]}).write_parquet(tmp_path / "c.parquet")
    with pytest.raises(HybridlabError, match=r"c.parquet has columns .*rerun its eval_lm_benchmarks job"):
        wrapper.gather_tables([*paths, tmp_path / "c.parquet"])
