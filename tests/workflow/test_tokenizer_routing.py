"""One tokenizer per model: the plan a preset resolves to, and what `snakemake -n` builds from it
(one mixture per distinct tokenizer; the Granite teacher's jobs read the Granite mixture; lm-eval gets
each model's own tokenizer). The smoke DAG keeps its shape: one BPE, two mixtures."""

import copy
import re
from pathlib import Path

import pytest

from hybridlab.config import load, resolve
from hybridlab.data.tokenizer import tokenizer_plan
from hybridlab.errors import HybridlabError

from smoke import dry_run_all

ROOT = Path(__file__).resolve().parents[2]
QWEN, GRANITE = "Qwen--Qwen3-4B", "ibm-granite--granite-4.1-3b"


def _view(scale):
    return resolve(load(ROOT / "config.yaml", {"scale": scale}))


def test_plan_paper_and_offline():
    paper = tokenizer_plan(_view("paper"))
    assert paper["sources"] == {"qwen3": "Qwen/Qwen3-4B", "granite4": "ibm-granite/granite-4.1-3b"}
    assert paper["teachers"] == {QWEN: "qwen3", GRANITE: "granite4"}
    assert (paper["multilingual"], paper["english"], paper["bld_nl"]) == (["granite4", "qwen3"], ["qwen3"], "qwen3")
    smoke = tokenizer_plan(_view("smoke"))
    assert smoke == {"sources": {"bpe": None}, "teachers": {"teacher": "bpe"}, "bld_nl": "bpe",
                     "multilingual": ["bpe"], "english": ["bpe"]}


def test_plan_errors():
    v = _view("paper")
    bad = copy.deepcopy(v)
    bad["models"]["teacher_tokenizers"]["ibm-granite/granite-4.1-3b"] = "granite"
    with pytest.raises(HybridlabError, match=r"teacher_tokenizers\[ibm-granite/granite-4.1-3b\] = 'granite' is not in "
                                             r"data.tokenizers \(allowed: granite4, qwen3\)"):
        tokenizer_plan(bad)
    bad = copy.deepcopy(v)
    del bad["models"]["teacher_tokenizers"]
    with pytest.raises(HybridlabError, match=r"teacher_tokenizers\[Qwen/Qwen3-4B\] is missing"):
        tokenizer_plan(bad)
    bad = copy.deepcopy(v)
    del bad["train"]["bld_nl"]["tokenizer"]
    with pytest.raises(HybridlabError, match=r"train.bld_nl.tokenizer is missing"):
        tokenizer_plan(bad)
    bad = copy.deepcopy(v)
    bad["models"]["teacher_tokenizers"]["Qwen/Qwen3-8B"] = "qwen3"
    with pytest.raises(HybridlabError, match=r"names \['Qwen--Qwen3-8B'\], which are not teachers"):
        tokenizer_plan(bad)
    one = copy.deepcopy(v)  # one tokenizer: every model uses it, no mapping needed
    one["data"]["tokenizers"] = {"qwen3": "Qwen/Qwen3-4B"}
    del one["models"]["teacher_tokenizers"], one["train"]["bld_nl"]["tokenizer"]
    assert set(tokenizer_plan(one)["teachers"].values()) == {"qwen3"}
    bad = _view("smoke")
    bad["data"]["tokenizers"] = {"qwen3": "Qwen/Qwen3-4B"}
    with pytest.raises(HybridlabError, match="data.tokenizers is for hub presets"):
        tokenizer_plan(bad)


def _dry_run(scale):
    """{rule: [shell command, ...]} of `snakemake -n -p --forceall all` at `scale` (no network, nothing built;
    --forceall: every job, whatever this checkout already built)."""
    jobs: dict[str, list[str]] = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", dry_run_all(scale)):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if m:
            jobs.setdefault(m.group(1), []).append(block)
    return jobs


def _arg(block, flag):
    m = re.search(rf"{flag} (\S+)", block)
    return m and m.group(1)


@pytest.mark.slow
def test_paper_dag_builds_one_mixture_per_tokenizer_and_routes_teachers():
    jobs = _dry_run("paper")
    tokenizers = sorted(re.search(r"output: (\S+)", b).group(1) for b in jobs["tokenizer"])
    assert tokenizers == ["results/data/paper/tokenizer/granite4/tokenizer.json",
                          "results/data/paper/tokenizer/qwen3/tokenizer.json"]
    mixtures = sorted(_arg(b, "--out") for b in jobs["mixture"])
    assert mixtures == ["results/data/paper/mixture/granite4/multilingual", "results/data/paper/mixture/qwen3/english",
                        "results/data/paper/mixture/qwen3/multilingual"]
    for b in jobs["mixture"]:
        tok = _arg(b, "--out").split("/")[4]
        assert _arg(b, "--tokenizer") == f"results/data/paper/tokenizer/{tok}/tokenizer.json"
    own = {QWEN: "qwen3", GRANITE: "granite4"}
    n = 0
    for rule in ("distill_stage1", "assemble_stage1", "distill_stage2"):
        for b in jobs[rule]:
            teacher = _arg(b, "--teacher").split("/")[-1]
            assert _arg(b, "--mixture") == f"results/data/paper/mixture/{own[teacher]}/multilingual", b[:300]
            n += teacher == GRANITE
    # per seed (3): one shared stage 1, then 9 placements (5 fixed, 4 searched) x 1 mixer assembled and distilled
    assert n == 3 + 27 + 27
    assert all(_arg(b, "--mixture") == "results/data/paper/mixture/qwen3/english" for b in jobs["bld_nl"])
    # one lm-eval job per model, each with its own tokenizer
    lm = jobs["eval_lm_benchmarks"]
    models = [m for b in lm for m in re.search(r"--models (.*?) --tokenizer", b).group(1).split()]
    toks = [t for b in lm for t in re.search(r"--tokenizer (.*?) --work", b).group(1).split()]
    assert len(lm) == len(models) == len(toks) == 2 + 18 + 30  # teachers, students (9 placements), BLD-NL sizes x 6
    for m, t in zip(models, toks):
        if "/bld_nl/" in m:
            assert t == "results/data/paper/tokenizer/qwen3"
        else:  # a teacher or one of its students: the teacher's own tokenizer, saved next to it
            teacher = GRANITE if GRANITE in m else QWEN
            assert t == f"results/models/paper/teachers/{teacher}"
    (ppl,) = jobs["eval_perplexity"]
    assert f'"{GRANITE}": "results/data/paper/mixture/granite4/multilingual"' in ppl


@pytest.mark.slow
def test_smoke_dag_keeps_its_shape():
    jobs = _dry_run("smoke")
    assert len(jobs["tokenizer"]) == 1 and len(jobs["mixture"]) == 2
    assert sorted(_arg(b, "--out") for b in jobs["mixture"]) == ["results/data/smoke/mixture/bpe/english",
                                                                 "results/data/smoke/mixture/bpe/multilingual"]
    counts = {rule: len(v) for rule, v in jobs.items()}
    # 10 tables: the 4 original, placement_tests, tokens_to_target, retrieval_score, sr_accuracy, kl_gaps and findings
    assert counts["table"] == 10 and counts["figure"] == 15
    # BLD-SR: 4 arms (one of each kind); distillation: one shared stage 1 (its all_mixers student converted), then 2
    # placements x (convert, assemble, stage 2); BLD-NL: 4 arms
    assert counts["bld_sr"] == 4 and counts["bld_nl"] == 4
    assert counts["distill_stage1"] == counts["importance_convert"] == 1
    assert counts["convert"] == counts["assemble_stage1"] == counts["distill_stage2"] == 2
    # NIAH and SoftCKA: one job per model (3 each) + a gather job each
    assert counts["eval_softcka_model"] == 3 and sum(counts.values()) == 63
