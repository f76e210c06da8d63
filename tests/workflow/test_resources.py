"""The host plan (hybridlab.pipeline.cluster.resources): every paper job's host RAM and disk fit its request, the
rules request what the plan says (mem_mb, disk_mb, runtime, gpu, one node), and a job larger than a node
is refused unless the multi-node launch is configured."""

from __future__ import annotations

import re

import pytest
import yaml

from smoke import ROOT, dry_run_all

from hybridlab import cli
from hybridlab import config as cfg
from hybridlab.pipeline.cluster import resources as res
from hybridlab.pipeline.cluster.launch import srun_prefix
from hybridlab.pipeline.cluster.plan import plan_preset

GB = 1e9


@pytest.fixture(scope="module")
def paper():
    raw = cfg.load(ROOT / "config.yaml", {"scale": "paper"})
    return raw, res.rule_resources(raw, plan_preset(raw))


def test_every_paper_job_fits_its_request_and_its_attempts(paper):
    _, rules = paper
    retries = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())["retries"]
    derived = [r for r in rules.values() if not r.fixed]
    assert {"corpus", "mixture", "teacher", "convert", "distill_stage1", "distill_stage2", "bld_nl",
            "eval_niah", "eval_lm_benchmarks"} <= {r.rule for r in derived}
    for r in derived:
        assert r.mem_mb * 1e6 >= r.host_bytes * res.HEADROOM, r
        assert r.disk_mb * 1e6 >= r.disk_bytes * res.HEADROOM, r
        # a job longer than one submission resumes from its checkpoints within the profile's attempts
        assert r.runtime * r.attempts >= r.minutes and r.attempts <= retries + 1, r


def test_paper_estimates_by_hand(paper):
    """Qwen3-4B: 4,022,468,096 parameters (its model card); the convert job holds the bf16 student (converted
    in place) and the teacher's file pages; a distillation rank the fp32 student and the bf16 teacher."""
    _, rules = paper
    from hybridlab.pipeline.cluster.plan import dense_params, model_params, shape_of

    s = shape_of("Qwen/Qwen3-4B")
    assert dense_params(s) == 4_022_468_096
    teacher, granite = dense_params(s), dense_params(shape_of("ibm-granite/granite-4.1-3b"))
    students = [model_params(s, m, 27) for m in ("gdn", "kda", "gla")]
    # the Qwen3-4B students are the larger: 36 layers, 9 keep attention (fa_ratio 0.25)
    big = max(students)
    assert rules["convert"].host_bytes == pytest.approx(0.5 * GB + 2 * big + 2 * teacher, abs=1)
    assert rules["convert"].disk_bytes == 2 * big
    assert rules["distill_stage2"].host_bytes == pytest.approx(4 * (3 * GB + 4 * big + 2 * teacher), abs=4)
    assert rules["teacher"].disk_bytes == 2 * max(teacher, granite)
    # lm-eval loads models of the DAG only (its largest: a Qwen3-4B student), bf16 + file pages + 2 GB
    assert rules["eval_lm_benchmarks"].host_bytes == pytest.approx(3 * GB + 4 * big + 2 * GB, abs=1)
    # SoftCKA of a model of the DAG: a student plus English and one language's fp32 states of 8 layers x 2
    # kinds, 1000 sentences of up to 64 tokens, width 2560; a published model's job is sized by its own size
    # and the widest hub model's width (4096)
    softcka = rules["eval_softcka_model"]
    assert softcka.by_model[""] == pytest.approx(3 * GB + 4 * big + 2 * 16 * 1000 * 64 * 2560 * 4, abs=1)
    assert softcka.by_model["Qwen/Qwen3-4B-Base"] == pytest.approx(3 * GB + 4 * 4.1e9 + 2 * 16 * 1000 * 64 * 4096 * 4,
                                                                   abs=1)
    # stage 2: 1e9 tokens x (2 x teacher + 6 x student + 2 x student for the checkpointed forward + both heads
    # recomputed in the KL's backward, 2 x 2 D V) FLOPs on 4 GPUs at 150 TFLOP/s, x 1.5, + 30 min
    heads = 2 * 2 * s.hidden_size * s.vocab_size
    minutes = 1e9 * (2 * teacher + 8 * big + heads) / (4 * 150e12) / 60 * 1.5 + 30
    assert rules["distill_stage2"].minutes == pytest.approx(minutes, abs=1)
    assert (8 * big + heads) / (6 * big) > 1.2  # what the old plan left out


def _jobs(text: str) -> list[tuple[str, dict[str, str], str]]:
    out = []
    for block in text.split("\n\n"):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        found = re.search(r"^\s*resources: (.*)$", block, re.M)
        if rule and found:
            out.append((rule.group(1), dict(kv.split("=", 1) for kv in found.group(1).split(", ")), block))
    return out


def test_the_paper_rules_request_what_the_plan_says(paper):
    """`snakemake -n all --config scale=paper`: every job's mem_mb, disk_mb, runtime, GPUs and one node."""
    _, rules = paper
    jobs = _jobs(dry_run_all("paper"))
    seen = set()
    hub = {m.replace("/", "--"): m for p in cfg.resolve(paper[0])["eval"]["analysis"]["hub_pairs"]
           for m in (p.get("hybrid"), p.get("dense")) if m}
    niah_mem, softcka_mem = {}, {}
    for rule, got, block in jobs:
        if rule not in rules:
            continue
        r = rules[rule]
        seen.add(rule)
        mem = r.mem_mb
        if rule == "eval_niah":  # one job per model, each sized by its own model
            slug = re.search(r"results/eval/paper/niah/(\S+)\.parquet", block).group(1)
            mem = niah_mem[slug] = r.mem_mb_for(hub.get(slug))
        if rule == "eval_softcka_model":  # likewise, one job per (seed, model)
            slug = re.search(r"results/eval/paper/softcka/seed\d+/(\S+)\.parquet", block).group(1)
            mem = softcka_mem[slug] = r.mem_mb_for(hub.get(slug))
        assert (int(got["mem_mb"]), int(got["disk_mb"]), int(got["runtime"])) == (mem, r.disk_mb, r.runtime), rule
        assert got["nodes"] == "1", rule
        assert int(got["gpu"]) == r.gpus, rule
    assert seen == set(rules) - {"tokenizer"} or seen == set(rules)
    # a 16.5B published MoE model's job asks for the rule's most; a 4B teacher's far less
    assert niah_mem["inclusionAI--Ring-mini-linear-2.0"] == rules["eval_niah"].mem_mb
    assert niah_mem["Qwen--Qwen3-4B"] < rules["eval_niah"].mem_mb / 2
    assert softcka_mem["inclusionAI--Ring-mini-linear-2.0"] == rules["eval_softcka_model"].mem_mb
    assert softcka_mem["Qwen--Qwen3-4B"] < softcka_mem["inclusionAI--Ring-mini-linear-2.0"]
    # the multi-GPU jobs: 4 GPUs on one node; the hub teacher's download none
    assert {rule: got["gpu"] for rule, got, _ in jobs if rule.startswith(("distill", "bld_nl"))} == {
        "distill_stage1": "4", "distill_stage2": "4", "bld_nl": "4"}
    assert {got["gpu"] for rule, got, _ in jobs if rule == "teacher"} == {"0"}


def _config_with_cluster(tmp_path, cluster: dict):
    data = yaml.safe_load((ROOT / "config.yaml").read_text())
    data["presets"]["paper"]["cluster"] = cluster
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_job_larger_than_a_node_is_refused_unless_multi_node(tmp_path, capsys):
    path = _config_with_cluster(tmp_path, {"gpus_per_node": 2})
    assert cli.main(["plan", "--configfile", str(path), "--scale", "paper"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: plan: distill_stage1 needs 4 GPUs but a node has 2") and "multi_node: true" in err
    assert "\n" not in err
    path = _config_with_cluster(tmp_path, {"gpus_per_node": 2, "multi_node": True})
    assert cli.main(["plan", "--configfile", str(path), "--scale", "paper"]) == 0
    out = capsys.readouterr().out.split("Per job of each rule")[1]
    row = next(line for line in out.splitlines() if line.startswith("distill_stage2 "))
    assert row.split()[1:3] == ["4", "2"]  # 4 GPUs on 2 nodes
    for name in ("host RAM GB", "mem_mb", "disk GB", "disk_mb", "runtime"):
        assert name in out


def test_placement_and_the_srun_launch():
    one = {"gpus_per_node": 8, "multi_node": False}
    assert res.placement("x", 8, one) == res.Placement(1, 8)
    with pytest.raises(Exception, match="x needs 9 GPUs but a node has 8"):
        res.placement("x", 9, one)
    assert res.placement("x", 9, {**one, "multi_node": True}) == res.Placement(2, 8)
    cmd = srun_prefix(3, 4, port=29600, python="py")
    assert cmd.startswith("srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --kill-on-bad-exit=1 py -m "
                          "torch.distributed.run --nnodes=3 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=")
    assert cmd.endswith(":29600 --rdzv_id=$SLURM_JOB_ID")
    with pytest.raises(Exception, match="port"):
        srun_prefix(2, 1, port=80)


def test_distill_flops_per_token_count_what_the_code_runs():
    f = res.distill_flops_per_token
    base = dict(p_teacher=10.0, p_student=8.0, p_trained=3.0, hidden=2, vocab=5)
    assert f(1, **base, checkpointing=True, recompute_heads=True) == 2 * 10 + 6 * 3  # stage 1: mixers only
    assert f(2, **base, checkpointing=False, recompute_heads=False) == 2 * 10 + 6 * 8
    assert f(2, **base, checkpointing=True, recompute_heads=False) == 2 * 10 + 8 * 8
    assert f(2, **base, checkpointing=True, recompute_heads=True) == 2 * 10 + 8 * 8 + 2 * 2 * 2 * 5
