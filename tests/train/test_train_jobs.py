"""The training jobs (hybridlab.pipeline.jobs.train) called directly, without Snakemake, on tiny local data and models:
what each publishes (files, metrics columns, summary keys), resume vs fresh start, the distillation step-0
row and the NaN stop, and the thin workflow scripts' --help."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from hybridlab.atomic import atomic_dir
from hybridlab.errors import HybridlabError
from hybridlab.pipeline.jobs import distill as distill_jobs, train as jobs

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["pretrain_teacher", "distill", "train_bld_sr", "train_bld_nl"]
TEACHER_SHAPE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                 "head_dim": 16, "intermediate_size": 64}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A BPE tokenizer and an English mixture packed with it (rows of 32 tokens in blocks of 2)."""
    from hybridlab.data.packing import pack_mixture, write_packed
    from hybridlab.data.tokenizer import train_bpe

    root = tmp_path_factory.mktemp("corpus")
    words = "the cat sat on a mat while rain fell over old hills and dogs ran home".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, 40)) for _ in range(120)]
    tok = train_bpe(texts, vocab_size=300, min_frequency=2, out_path=root / "tokenizer")
    docs = pl.DataFrame([{"doc_id": f"d{k:03d}", "lang": "eng_Latn", "source": "t", "text": t}
                         for k, t in enumerate(texts)])
    mix = pack_mixture(docs, tok, languages=[], english_share=1.0, seq_len=32, total_tokens=32 * 64,
                       val_fraction=0.1, seed=0, block_rows=2)
    write_packed(root / "mixture", mix)
    return {"tokenizer": root / "tokenizer", "mixture": root / "mixture"}


def _teacher_params(steps=4):
    return {"name": "teacher", "seed": 0, "shape": TEACHER_SHAPE,
            "train": {"steps": steps, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "eval_every": 2,
                      "ckpt_every": 2, "eval_rows_per_language": 2, "epochs": 10}}


def _pretrain(corpus, tmp, **kw):
    return jobs.pretrain_teacher(_teacher_params(), mixture=corpus["mixture"], tokenizer=corpus["tokenizer"],
                                 work=tmp / "work", out=tmp / "teacher", **kw)


def _published(out):
    """summary.json of a published output (the returned summary is the same, through JSON)."""
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def teacher(corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("teacher")
    _pretrain(corpus, tmp)
    return tmp / "teacher"


# ---- shared pieces ----------------------------------------------------------------------------------------------


def test_a_published_output_is_replaced_whole_and_only_on_success(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old run")
    with atomic_dir(out) as tmp:
        jobs.write_summary(tmp, {"b": 1, "a": [1, 2]})
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"] and sorted(tmp_path.iterdir()) == [out]
    assert (out / "summary.json").read_text() == '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}'
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            raise RuntimeError("killed mid-write")
    assert (out / "summary.json").is_file()  # the published output is untouched


def test_initial_row_and_final_eval_of_a_metrics_log():
    log = pl.DataFrame({"step": [1, 2, 3], "tokens": [64, 128, 192], "loss": [3.0, 2.5, 2.0],
                        "eval/kl": [None, 0.5, None], "eval/ce": [None, 2.4, None]})
    metrics = jobs.with_initial_row(log, {"kl": 1, "ce": 3.5})
    assert metrics["step"].to_list() == [0, 1, 2, 3] and metrics.schema["step"] == log.schema["step"]
    assert metrics.row(0, named=True) == {"step": 0, "tokens": 0, "eval/kl": 1.0, "eval/ce": 3.5, "loss": None}
    assert jobs.final_eval(metrics, "stage 2") == {"kl": 0.5, "ce": 2.4}
    diverged = metrics.with_columns(pl.when(pl.col("step") == 2).then(float("nan")).otherwise(pl.col("eval/ce"))
                                    .alias("eval/ce"))
    with pytest.raises(HybridlabError, match=r"^stage 2 ended with NaN held-out metrics; lower the lr and rerun "
                                             r"with --restart$"):
        jobs.final_eval(diverged, "stage 2")


# ---- teacher ----------------------------------------------------------------------------------------------------


def test_pretrain_teacher_publishes_resumes_and_restarts(corpus, tmp_path, capsys):
    summary = _pretrain(corpus, tmp_path)
    out = tmp_path / "teacher"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "metrics.parquet",
                                                     "model.safetensors", "summary.json"]
    assert _published(out) == json.loads(json.dumps(summary))
    assert set(summary) == {"parameters", "steps", "tokens", "heldout", "unigram_baseline_ce"}
    assert summary["steps"] == 4 and summary["tokens"] == 4 * 4 * 31  # scored positions: 31 of each 32-token row
    assert set(summary["heldout"]) == {"ce", "ce/eng_Latn"} and math.isfinite(summary["heldout"]["ce"])
    assert 0 < summary["unigram_baseline_ce"] <= math.log(300)
    metrics = pl.read_parquet(out / "metrics.parquet")
    assert metrics["step"].to_list() == [2, 4] and {"loss", "lr", "eval/ce"} <= set(metrics.columns)  # eval_every 2
    assert not list(tmp_path.glob(".teacher.tmp"))
    (work,) = list((tmp_path / "work").iterdir())
    first = load_file(out / "model.safetensors")
    capsys.readouterr()

    # A killed job's rerun (its output gone): the same work directory resumes the finished run, trains nothing.
    (out / "summary.json").unlink()
    again = _pretrain(corpus, tmp_path)
    assert "resuming" in capsys.readouterr().out and list((tmp_path / "work").iterdir()) == [work]
    assert again == summary and (out / "summary.json").is_file()
    assert all(torch.equal(t, first[k]) for k, t in load_file(out / "model.safetensors").items())

    # restart: a fresh run from the same seed (no resume), so the same weights again
    _pretrain(corpus, tmp_path, restart=True)
    assert "resuming" not in capsys.readouterr().out
    assert all(torch.equal(t, first[k]) for k, t in load_file(out / "model.safetensors").items())


# ---- distillation -----------------------------------------------------------------------------------------------


def _distill_params(stage=2):
    """One stage's params, as its rule passes them (the other stage's keys would be refused)."""
    run = {"steps": 2, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 1}
    common = {"seed": 0, "eval_every_tokens": 128, "ckpt_every_tokens": 128, "eval_rows_per_language": 2,
              "eval_batch_size": 2, "gradient_checkpointing": False}
    if stage == 1:
        return {**common, "stage1": run, "stage1_inputs": "teacher"}
    return {**common, "stage2": run, "kl_chunk_tokens": 64, "kl_vocab_chunk": None}


@pytest.fixture(scope="module")
def student(teacher, tmp_path_factory):
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.io import save_hybrid
    from hybridlab.models.registry import load_causal_lm

    out = tmp_path_factory.mktemp("student") / "converted"
    save_hybrid(convert_to_hybrid(load_causal_lm(str(teacher)), [0], "gdn", seed=0), out)
    return out


def test_distill_stages_store_the_step0_point_and_publish_the_hybrid(corpus, teacher, student, tmp_path,
                                                                     monkeypatch):
    from hybridlab.data.packed_dataset import PackedDataset

    read: dict[int, list[int]] = {}  # train rows read per stage (the train split is the longer one)
    item = PackedDataset.__getitem__

    def recording(self, i):
        if len(self) == n_train:
            read.setdefault(stage, []).append(int(i))
        return item(self, i)

    n_train = len(PackedDataset(corpus["mixture"], "train"))
    monkeypatch.setattr(PackedDataset, "__getitem__", recording)
    stage = 1
    s1 = distill_jobs.distill(_distill_params(1), stage=1, teacher=str(teacher), student=student, mixture=corpus["mixture"],
                      work=tmp_path / "w1", out=tmp_path / "stage1")
    stage = 2
    s2 = distill_jobs.distill(_distill_params(2), stage=2, teacher=str(teacher), student=tmp_path / "stage1",
                      mixture=corpus["mixture"], work=tmp_path / "w2", out=tmp_path / "stage2")
    # stage 2 reads only rows stage 1 never saw, and starts from stage 1's last evaluation (the same weights)
    assert read[1] and read[2] and not set(read[1]) & set(read[2])
    assert s1["train_rows"] == {"n": n_train, "seed": 0, "seen": len(read[1])}
    assert s2["initial"] == {k: v for k, v in s1["final"].items() if k != "align"}
    for stage, summary in ((1, s1), (2, s2)):
        out = tmp_path / f"stage{stage}"
        assert {"config.json", "model.safetensors", "hybrid.json", "metrics.parquet", "summary.json"} <= {
            p.name for p in out.iterdir()}
        assert _published(out) == json.loads(json.dumps(summary))
        metrics = pl.read_parquet(out / "metrics.parquet")
        assert set(summary) == {"stage", "steps", "tokens", "trainable_parameters", "train_seconds", "precision",
                                "initial", "final", "eval_rows", "train_rows"}
        assert summary["precision"] in ("fp32", "bf16")  # the precision the stage resolved to and ran at
        assert summary["stage"] == stage and summary["steps"] == 2 and summary["tokens"] == metrics["tokens"][-1] > 0
        first = metrics.row(0, named=True)
        assert first["step"] == 0 and first["tokens"] == 0
        evaluated = metrics.filter(pl.col("eval/kl").is_not_null())["step"].to_list()
        assert evaluated == ([0, 2] if stage == 1 else [0, 1, 2])  # stage 1 evaluates at its ends only
        assert {k.removeprefix("eval/"): first[k] for k in metrics.columns if k.startswith("eval/")} == pytest.approx(
            summary["initial"])
        assert summary["final"] == pytest.approx({k.removeprefix("eval/"): v for k, v in metrics.row(-1, named=True)
                                                  .items() if k.startswith("eval/")})
        (work,) = list((tmp_path / f"w{stage}").iterdir())
        assert json.loads((work / jobs.INITIAL_EVAL_FILE).read_text()) == summary["initial"]
        extra = json.loads((out / "hybrid.json").read_text())["extra"]
        assert extra[f"distill_stage{stage}"] == {"teacher": str(teacher), "steps": 2,
                                                  "tokens": summary["tokens"]}
    assert "align" in s1["initial"] and "align" not in s2["initial"]
    assert {"ce", "kl", "ce/eng_Latn", "kl/eng_Latn"} <= set(s2["final"])
    assert s1["trainable_parameters"] < s2["trainable_parameters"]  # stage 1 trains the mixers only


def test_assembled_stage1_takes_the_shared_mixers_and_feeds_stage2(corpus, teacher, student, tmp_path):
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.io import save_hybrid
    from hybridlab.models.registry import load_causal_lm

    every = tmp_path / "all_mixers"
    save_hybrid(convert_to_hybrid(load_causal_lm(str(teacher)), [], "gdn", seed=0), every)
    shared = distill_jobs.distill(_distill_params(1), stage=1, teacher=str(teacher), student=every, mixture=corpus["mixture"],
                          work=tmp_path / "w1", out=tmp_path / "shared")
    with pytest.raises(HybridlabError, match="not a published stage-1 run"):
        distill_jobs.assemble_stage1(_distill_params(2), teacher=str(teacher), student=student, shared=every,
                             mixture=corpus["mixture"], out=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    s1 = distill_jobs.assemble_stage1(_distill_params(2), teacher=str(teacher), student=student, shared=tmp_path / "shared",
                              mixture=corpus["mixture"], out=tmp_path / "stage1")
    mine, theirs = (load_file(tmp_path / d / "model.safetensors") for d in ("stage1", "shared"))
    converted = load_file(student / "model.safetensors")
    assert s1["layers"] == [1] and s1["train_rows"] == shared["train_rows"] and s1["tokens"] == shared["tokens"]
    for k, v in mine.items():  # layer 1's mixer from the shared run, layer 0 (FA) the converted student's
        assert torch.equal(v, theirs[k] if ".layers.1.self_attn.mixer." in k else converted[k]), k
    metrics = pl.read_parquet(tmp_path / "stage1" / "metrics.parquet")
    assert metrics["tokens"].to_list() == [0, shared["tokens"]]
    assert metrics["eval/kl"].to_list() == pytest.approx([s1["initial"]["kl"], s1["final"]["kl"]])
    assert s1["final"]["kl"] < s1["initial"]["kl"]  # the trained mixer is closer to the attention it replaces
    s2 = distill_jobs.distill(_distill_params(2), stage=2, teacher=str(teacher), student=tmp_path / "stage1",
                      mixture=corpus["mixture"], work=tmp_path / "w2", out=tmp_path / "stage2")
    assert s2["initial"] == s1["final"]  # stage 2's first point is the assembled student's evaluation


def test_distill_stops_on_nan_heldout_metrics_and_publishes_nothing(corpus, teacher, student, tmp_path,
                                                                     monkeypatch):
    from hybridlab.train import distill

    monkeypatch.setattr(distill, "heldout_curve_metrics", lambda *a, **k: {"ce": float("nan"), "kl": float("nan")})
    with pytest.raises(HybridlabError) as err:
        distill_jobs.distill(_distill_params(), stage=2, teacher=str(teacher), student=student, mixture=corpus["mixture"],
                     work=tmp_path / "work", out=tmp_path / "out")
    assert str(err.value) == "stage 2 ended with NaN held-out metrics; lower the lr and rerun with --restart"
    assert not (tmp_path / "out").exists()


def test_distill_sharded_in_one_process_publishes_the_unsharded_runs_model(corpus, teacher, student, tmp_path):
    """fsdp: always (FSDP2 in a group of one) with a weights-only end: the 0-token point and the published
    weights are the plain run's (fp32: the runs differ only in how the gradient norm is summed)."""
    plain, sharded = _distill_params(), _distill_params()
    sharded["stage2"] = {**sharded["stage2"], "fsdp": "always"}
    sharded["final_checkpoint"] = "weights"
    out = {}
    for name, params in (("plain", plain), ("sharded", sharded)):
        out[name] = distill_jobs.distill(params, stage=2, teacher=str(teacher), student=student, mixture=corpus["mixture"],
                                 work=tmp_path / f"w-{name}", out=tmp_path / name)
    assert out["sharded"]["initial"] == pytest.approx(out["plain"]["initial"], rel=1e-6)
    assert out["sharded"]["final"] == pytest.approx(out["plain"]["final"], rel=1e-5)
    a, b = (load_file(tmp_path / name / "model.safetensors") for name in ("plain", "sharded"))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert max((a[k] - load_file(student / "model.safetensors")[k]).abs().max().item() for k in a) > 1e-4


# ---- BLD --------------------------------------------------------------------------------------------------------


def test_train_bld_sr_publishes_score_checkpoints_and_summary(tmp_path):
    from hybridlab.data import spaced_retrieval as sr

    cfg = sr.SpacedRetrievalConfig(t=3, gaps=(2, 6), gap_weights=(0.5, 0.5), n_train=32, n_val=8, n_test=8, seed=0)
    for split in sr.SPLITS:
        sr.write_split(tmp_path / "data" / f"{split}.parquet", sr.generate_split(cfg, split), split=split, seed=0)
    params = {"seed": 0, "arm": {"name": "window1u+2u", "update_windows": [[1, 3]]}, "mixer": "kda",
              "pattern": ["mixer", "full_attention"], "score_fractions": [0.5, 1.0], "score_updates": [3],
              "train": {"model": {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2,
                                  "head_dim": 8, "intermediate_size": 32},
                        "steps": 4, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "log_every": 1,
                        "eval_every": 2, "ckpt_every": 2, "eval_rows_per_gap": 2}}
    out = tmp_path / "arm"
    summary = jobs.train_bld_sr(params, data=str(tmp_path / "data"), work=tmp_path / "work", out=out, threads=1)
    assert _published(out) == json.loads(json.dumps(summary))
    assert set(summary) == {"arm", "seed", "parameters", "steps", "tokens", "layer_types", "freeze_windows",
                            "freeze_scope", "recurrent_layers", "optimizer_switch_step", "long_gap_fraction", "test",
                            "wall_s"}
    assert summary["steps"] == 4 and summary["freeze_windows"] == [(1, 3)] and summary["layer_types"] == [
        "kda", "full_attention"]
    assert set(summary["test"]) == {"acc/gap2", "acc/gap6", "seq_acc/gap2", "seq_acc/gap6"}
    index = json.loads((out / "score_checkpoints" / "index.json").read_text())
    assert [(c["step"], c["path"]) for c in index["checkpoints"]] == [
        (2, "score_checkpoints/step_000002"), (3, "score_checkpoints/step_000003"),
        (4, "score_checkpoints/step_000004")]
    assert all((out / c["path"] / "model.safetensors").is_file() for c in index["checkpoints"])
    metrics = pl.read_parquet(out / "metrics.parquet")
    assert {"acc/gap2", "seq_acc/gap6", "eval/acc/gap2", "grad_norm/kda"} <= set(metrics.columns)
    # updates 1 and 2 frozen, logged at steps 2 and 3: the KDA mixer gets no gradient exactly there
    assert metrics["frozen"].to_list() == [False, True, True, False]
    assert [g == 0.0 for g in metrics["grad_norm/kda"]] == [False, True, True, False]


def test_train_bld_nl_publishes_the_arm_with_its_tokenizer(corpus, tmp_path):
    params = {"seed": 0, "arm": {"name": "gdn-bld", "mixer": "gdn", "size": "xs", "variant": "bld"},
              "shape": {"hidden_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2,
                        "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32},
              "run": {"context_len": 64, "steps": 4, "micro_batch_size": 2, "lr": 3e-3, "warmup_fraction": 0.25,
                      "eval_every": 2, "eval_rows": 2},
              "experiment": {"mixers": ["gdn"], "pattern": ["full_attention", "mixer", "mixer", "mixer"], "freeze_fraction": 0.5,
                             "freeze_scope": "block", "optimizer_after_unfreeze": "adamw"}}
    out = tmp_path / "arm"
    summary = jobs.train_bld_nl(params, mixture=corpus["mixture"], tokenizer=corpus["tokenizer"],
                                work=tmp_path / "work", out=out, threads=1)
    assert _published(out) == json.loads(json.dumps(summary))
    assert set(summary) == {"arm", "mixer", "size", "variant", "parameters", "steps", "tokens", "context_len",
                            "freeze_windows", "frozen_parameters", "optimizer_switch_step", "optimizer_after_switch",
                            "heldout"}
    assert summary["steps"] == 4 and summary["tokens"] == 4 * 2 * 63 and summary["freeze_windows"] == [(0, 1)]
    assert summary["frozen_parameters"] > 0 and math.isfinite(summary["heldout"]["ce"])
    assert {"hybrid.json", "model.safetensors", "tokenizer.json", "metrics.parquet"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "hybrid.json").read_text())["extra"]["arm"] == "gdn-bld"


class _Started(Exception):
    """Stops a job at the start of its training loop (test below)."""


def test_bld_nl_arms_of_one_seed_start_from_the_same_weights_and_batches(corpus, tmp_path, monkeypatch):
    """experiments.bld_nl: baseline and BLD of one mixer and seed start from the same weights and draw the same
    batches (the comparison is paired); another seed starts elsewhere. The job runs up to its training loop,
    where the model and the loop's seeded sampler are read."""
    from hybridlab.train import loop
    from hybridlab.train.sampler import EpochSampler

    seen = {}

    def start(model, task, dataset, cfg, **kwargs):
        order = EpochSampler(len(dataset), cfg.seed).next_indices(3 * cfg.batch_size)  # the first three batches
        seen[key] = ({k: v.clone() for k, v in model.state_dict().items()}, list(order))
        raise _Started

    monkeypatch.setattr(loop, "train", start)
    base = {"shape": {"hidden_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
                      "head_dim": 8, "intermediate_size": 32},
            "run": {"context_len": 64, "steps": 4, "micro_batch_size": 2, "lr": 3e-3, "warmup_fraction": 0.25,
                    "eval_every": 4},
            "experiment": {"mixers": ["gdn"], "pattern": ["full_attention", "mixer", "mixer", "mixer"], "freeze_fraction": 0.5,
                           "freeze_scope": "block", "optimizer_after_unfreeze": "adamw"}}
    for key in [("baseline", 0), ("bld", 0), ("baseline", 1)]:
        variant, seed = key
        params = {**base, "seed": seed, "arm": {"name": f"gdn-{variant}", "mixer": "gdn", "size": "xs", "variant": variant}}
        with pytest.raises(_Started):
            jobs.train_bld_nl(params, mixture=corpus["mixture"], tokenizer=corpus["tokenizer"],
                              work=tmp_path / f"work-{variant}-{seed}", out=tmp_path / f"out-{variant}-{seed}", threads=1)
    (w_base, o_base), (w_bld, o_bld), (w_other, o_other) = (seen[k] for k in [("baseline", 0), ("bld", 0), ("baseline", 1)])
    assert w_base.keys() == w_bld.keys() and all(torch.equal(w_base[k], w_bld[k]) for k in w_base)
    assert o_base == o_bld
    assert any(not torch.equal(w_base[k], w_other[k]) for k in w_base) and o_base != o_other


# ---- the thin scripts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_training_scripts_are_thin_and_their_help_shows_the_sections_keys(name):
    path = ROOT / "workflow_scripts" / f"{name}.py"
    assert len(path.read_text().splitlines()) <= 45
    p = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "--work" in p.stdout
    # the --params keys are the job section's, as config_spec describes them (no hand-written copy)
    from hybridlab.config_spec import DISTILL_JOBS, JOBS, describe_job

    for cls in DISTILL_JOBS.values() if name == "distill" else [JOBS[f"{name}.py"]]:
        assert describe_job(cls) in p.stdout


def test_a_job_refuses_params_its_section_does_not_have_in_one_line(tmp_path):
    """A key of the other stage, a missing key and a wrong value: one line naming the key, before any work."""
    wrong = {**_distill_params(2), "stage1_inputs": "teacher"}
    with pytest.raises(HybridlabError, match=r"^distill.py --stage 2 --params: unknown key 'stage1_inputs' "):
        distill_jobs.distill(wrong, stage=2, teacher="t", student="s", mixture="m", work=tmp_path / "w", out=tmp_path / "o")
    args = ["--stage", "1", "--teacher", "t", "--student", "s", "--mixture", "m", "--work", str(tmp_path / "w"),
            "--out", str(tmp_path / "o")]
    bad = {**_distill_params(1), "stage1_inputs": "both"}
    p = subprocess.run([sys.executable, str(ROOT / "workflow_scripts" / "distill.py"), "--params", json.dumps(bad),
                        *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("error: distill.py --params: stage1_inputs = 'both' is not allowed (allowed: "
                               "teacher, student)")
    missing = {k: v for k, v in _distill_params(1).items() if k != "seed"}
    with pytest.raises(HybridlabError, match="missing key 'seed'"):
        distill_jobs.distill(missing, stage=1, teacher="t", student="s", mixture="m", work=tmp_path / "w", out=tmp_path / "o")
    assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()
