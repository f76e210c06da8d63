"""The DAG: dry runs of every preset, and the `data` phase end to end at `smoke` through Snakemake."""

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from smoke import ROOT, dry_run_all, run_snakemake
import torch

pytestmark = pytest.mark.smoke_dag  # built in the session's smoke repository (tests/conftest.py)

PHASE_RULES = {
    "data": {"corpus", "tokenizer", "mixture", "spaced_retrieval"},
    "models": {"teacher", "convert"},
    "train": {"distill_stage1", "assemble_stage1", "distill_stage2", "bld_sr", "bld_nl"},
    "eval": {"eval_softcka_model", "eval_softcka", "eval_recency", "eval_fertility", "eval_perplexity", "eval_niah", "niah_tables",
             "eval_retrieval_score", "eval_retrieval_heads", "eval_position_loss"},
    "figures": {"figure"},
}


def _snakemake(cwd, *args, timeout=600):
    return run_snakemake(cwd, *args, timeout=timeout)


def _job_counts(stdout: str) -> dict[str, int]:
    lines = stdout.split("Job stats:")[1].splitlines()[3:]
    counts = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


@pytest.fixture(scope="module")
def dry_run():
    """scale -> job counts of `snakemake -n --forceall all` (each preset's dry run once per module)."""
    done = {}

    def counts(scale):
        if scale not in done:
            done[scale] = _job_counts(dry_run_all(scale))
        return done[scale]
    return counts


@pytest.mark.parametrize("scale", ["smoke", "tiny", "paper", "rehearsal"])
def test_dry_run_lists_every_phase(dry_run, scale):
    counts = dry_run(scale)
    for phase, rules in PHASE_RULES.items():
        assert rules <= set(counts), f"{phase} rules missing from the {scale} DAG: {rules - set(counts)}"
    # placements x teachers x 1 mixer x replicate seeds: smoke runs 2 placements, the rehearsal standard periodic
    # and searched_nonlatin, tiny the 5 fixed ones and searched, paper also the 3 per-group searched ones
    n_teachers = 2 if scale in ("paper", "rehearsal") else 1
    n_students = {"smoke": 2, "rehearsal": 2, "tiny": 6, "paper": 9}[scale] * n_teachers
    n_seeds = 3 if scale in ("tiny", "paper") else 1
    # the rehearsal distils standard periodic with a second seed: one more student and shared stage 1 per teacher
    extra_seed = n_teachers if scale == "rehearsal" else 0
    assert counts["convert"] == counts["assemble_stage1"] == counts["distill_stage2"] == \
        n_students * n_seeds + extra_seed
    # one shared stage 1 per teacher x mixer x seed (its all_mixers student: every layer converted); a preset with
    # a searched placement scores its layers once per teacher x mixer
    assert counts["importance_convert"] == counts["distill_stage1"] == n_teachers * n_seeds + extra_seed
    assert "importance_stage1" not in counts
    assert counts.get("eval_layer_importance", 0) == (0 if scale == "smoke" else n_teachers)
    assert counts["figure"] >= 8 and counts["table"] >= 1


def _job_params(text: str) -> list[tuple[str, list[str], dict]]:
    """(script, argv, --params) of every job in a dry run whose shell command runs a workflow script."""
    import shlex

    out = []
    for line in text.splitlines():
        if "workflow_scripts/" not in line or "--params" not in line:
            continue
        argv = shlex.split(line.split(" > ")[0])
        script = next(Path(a).name for a in argv if a.startswith("workflow_scripts/"))
        out.append((script, argv, json.loads(argv[argv.index("--params") + 1])))
    return out


@pytest.mark.parametrize("scale", ["smoke", "tiny", "real", "paper", "rehearsal"])
def test_every_job_gets_exactly_its_sections_keys(scale):
    """Each job's --params are keys of its typed section (hybridlab.config_spec.job_sections), with every
    required one: the section is built and checked from them as the job builds it (an extra key would be
    refused). No script of the DAG reads --params without a section."""
    import dataclasses

    from hybridlab.config_spec import job_settings
    from hybridlab.config_spec import DISTILL_JOBS, JOBS
    from hybridlab.data.offline import load_config

    seen = set()
    for script, argv, params in _job_params(dry_run_all(scale)):
        if script == "build_offline_corpus.py":  # its own typed config (OfflineCorpusConfig)
            load_config(params=json.dumps(params))
            continue
        cls = DISTILL_JOBS[int(argv[argv.index("--stage") + 1])] if script == "distill.py" else JOBS.get(script)
        assert cls is not None, f"{scale}: {script} reads --params without a typed section"
        fields = {f.name for f in dataclasses.fields(cls)}
        assert set(params) <= fields, f"{scale} {script}: keys {sorted(set(params) - fields)} are not {cls.__name__}'s"
        job_settings(cls, params, script)
        seen.add(cls.__name__)
    training = {"TeacherJob", "MixtureJob", "DistillStage1Job", "DistillStage2Job", "ConvertJob", "SoftckaJob",
                "PerplexityJob", "FigureJob"}
    training |= {"LayerImportanceJob"} if scale != "smoke" else set()
    training |= {"BldSrJob", "BldNlJob", "RetrievalScoreJob", "PositionLossJob"} if scale != "real" else set()
    assert training <= seen, training - seen


def test_real_preset_runs_the_multilinguality_study_on_the_gguf_teacher(dry_run):
    """Two seeds for the periodic placements and the searched one, one for the other three, each assembled from the
    shared stage 1 of its seed (the all_mixers student, converted and aligned once per seed); no BLD job; the GGUF teacher is
    converted (not fetched, not pre-trained) and its tokenizer read from the converted directory."""
    from smoke import dry_run_all

    counts = dry_run("real")
    assert counts["convert"] == counts["assemble_stage1"] == counts["distill_stage2"] == 2 + 2 + 1 + 1 + 1 + 2
    assert counts["distill_stage1"] == counts["importance_convert"] == 2  # one shared stage 1 per seed
    assert counts["eval_layer_importance"] == counts["layer_importance_table"] == 1
    assert counts["teacher"] == 1 and counts["results_page"] == 1
    assert not {"bld_sr", "bld_nl", "spaced_retrieval", "eval_retrieval_score", "eval_position_loss"} & set(counts)
    text = dry_run_all("real")
    assert "convert_gguf_teacher.py" in text and "fetch_teacher.py" not in text
    assert "--parallel results/data/real/corpus/parallel.parquet" in text


def _blocks(text: str, rule: str) -> list[str]:
    """The dry run's job blocks of `rule` (from `rule <name>:` to the next blank line)."""
    return [b for b in text.split("\n\n") if f"rule {rule}:" in b]


def test_lm_eval_and_niah_run_one_job_per_model_and_a_gather_job(dry_run):
    """A time-out costs one model's work: a job per model, resumable, gathered into the same tables."""
    paper = dry_run("paper")
    # 2 teachers + 18 students (9 placements) + 30 / 9 hub models
    assert paper["eval_lm_benchmarks"] == 2 + 18 + 30 and paper["lm_benchmarks_table"] == 1
    assert paper["eval_niah"] == 2 + 18 + 9 and paper["niah_tables"] == 1
    text = dry_run_all("paper")
    (gather,) = _blocks(text, "niah_tables")
    assert "results/eval/paper/niah.parquet" in gather and "results/eval/paper/niah_examples.parquet" in gather
    assert all("--work results/eval/paper/runs/" in b for b in _blocks(text, "eval_niah") + _blocks(text, "eval_lm_benchmarks"))
    smoke = dry_run("smoke")
    assert smoke["eval_niah"] == 3 and smoke["niah_tables"] == 1  # the teacher and its two students


@pytest.mark.parametrize("scale, script", [("paper", "fetch_teacher.py"), ("real", "convert_gguf_teacher.py")])
def test_a_teacher_fetched_or_converted_requests_no_gpu(scale, script):
    blocks = _blocks(dry_run_all(scale), "teacher")
    assert blocks and all(script in b and "gpu=0" in b for b in blocks)


def test_rehearsal_builds_the_same_rules_as_paper(dry_run):
    """The rehearsal preset's point: the paper preset's code paths, so the same rules (counts may differ)."""
    paper, rehearsal = set(dry_run("paper")), set(dry_run("rehearsal"))
    assert paper == rehearsal and "eval_softcka_seed" in rehearsal  # a second seed of standard periodic
    assert "eval_lm_benchmarks" in rehearsal and "eval_lm_benchmarks" not in set(dry_run("smoke"))


@pytest.mark.slow
def test_data_phase_end_to_end_at_smoke(smoke_workdir):
    work = smoke_workdir
    out = work / "results" / "data" / "smoke"

    # Corpus: N-way parallel set with English, monolingual text, a manifest with package versions.
    par = pl.read_parquet(out / "corpus" / "parallel.parquet")
    assert par.schema == {"sid": pl.Int64, "lang": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8}
    langs = set(par["lang"].unique())
    assert "eng_Latn" in langs and len(langs) >= 3
    per_sid = par.group_by("sid").agg(pl.col("lang").n_unique().alias("n"))
    assert per_sid["n"].min() == len(langs), "every sentence must exist in every language"
    eng = par.filter(pl.col("lang") == "eng_Latn")["text"]
    assert eng.str.split(" ").list.len().min() >= 5
    mono = pl.read_parquet(out / "corpus" / "mono.parquet")
    assert {"doc_id", "lang", "text", "source"} == set(mono.columns)
    assert "eng_Latn" in set(mono["lang"]) and mono["doc_id"].n_unique() == mono.height
    manifest = json.loads((out / "corpus" / "manifest.json").read_text())
    assert manifest["packages"], "package versions are recorded"

    # Tokenizer: byte-level BPE of the configured size, exact round trip on corpus text.
    from hybridlab.data.tokenizer import load_tokenizer

    tok = load_tokenizer(out / "tokenizer" / "bpe")  # the one tokenizer of an offline preset
    assert len(tok) == 512
    sample = par["text"][0]
    assert tok.decode(tok(sample)["input_ids"]) == sample

    # Mixtures: fixed-length rows, one language each, train and val present, English share near 0.3.
    seq_len = 64
    for name in ("multilingual", "english"):
        tokens = np.load(out / "mixture" / "bpe" / name / "tokens.npy", mmap_mode="r")
        meta = pl.read_parquet(out / "mixture" / "bpe" / name / "meta.parquet")
        assert tokens.shape[1] == seq_len and tokens.shape[0] == meta.height
        assert set(meta["split"]) == {"train", "val"}
        assert tokens.max() < len(tok)
        assert json.loads((out / "mixture" / "bpe" / name / "stats.json").read_text())["max_token_id"] == tokens.max()
    meta = pl.read_parquet(out / "mixture" / "bpe" / "multilingual" / "meta.parquet").filter(pl.col("split") == "train")
    share = (meta["lang"] == "eng_Latn").mean()
    assert 0.2 < share < 0.4
    assert set(pl.read_parquet(out / "mixture" / "bpe" / "english" / "meta.parquet")["lang"]) == {"eng_Latn"}

    # Spaced Retrieval splits with the configured sizes and gaps.
    from hybridlab.data.spaced_retrieval import read_split

    train = read_split(out / "spaced_retrieval" / "train.parquet")
    assert len(train) == 512 and set(train.gaps_N.tolist()) == {8, 32}

    # A second run has nothing to do.
    again = _snakemake(work, "-n", "data", "--config", "scale=smoke")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr



@pytest.mark.slow
def test_teacher_pretraining_at_smoke_beats_unigram(smoke_workdir):
    work = smoke_workdir
    target = "results/models/smoke/teachers/teacher/model.safetensors"
    proc = _snakemake(work, target, "--config", "scale=smoke", "--cores", "2")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    teacher = work / "results/models/smoke/teachers/teacher"
    summary = json.loads((teacher / "summary.json").read_text())
    assert summary["steps"] == 30
    assert summary["heldout"]["ce"] < summary["unigram_baseline_ce"] - 0.3
    assert {k for k in summary["heldout"] if k.startswith("ce/")} >= {"ce/eng_Latn", "ce/tel_Telu"}
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(teacher)
    assert model.config.num_hidden_layers == 4
    metrics = pl.read_parquet(teacher / "metrics.parquet")
    assert metrics["loss"][-1] < metrics["loss"][0]


@pytest.mark.slow
def test_models_phase_at_smoke_converts_every_placement(smoke_workdir):
    work = smoke_workdir
    proc = _snakemake(work, "models", "--config", "scale=smoke", "--cores", "2")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    from hybridlab.models.io import load_hybrid, read_spec

    students = work / "results/models/smoke/students/seed0/teacher"
    got = {d.name: read_spec(d)["fa_layers"] for d in sorted(students.iterdir())}
    # 4 layers, ratio 0.25 -> one FA layer: last (standard periodic) or first (sandwich; the other schemes
    # too, which is why smoke converts these two only: tests/models/test_placements.py).
    # all_mixers: every layer converted, the shared stage 1's student
    assert got == {"all_mixers-gdn": [], "sandwich-gdn": [0], "standard_periodic-gdn": [3]}
    student = load_hybrid(students / "standard_periodic-gdn")
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(work / "results/models/smoke/teachers/teacher")
    layer = student.model.layers[0].self_attn.mixer
    assert torch.equal(layer.v_proj.weight[:16], teacher.model.layers[0].self_attn.v_proj.weight[:16])
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.isfinite(student(input_ids=ids).logits).all()
