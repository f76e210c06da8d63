"""config.yaml validation: every bad value stops with one line naming the key and the allowed values."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hybridlab import config as cfg
from hybridlab.errors import HybridlabError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base():
    return cfg.expand_presets(yaml.safe_load((ROOT / "config.yaml").read_text()))


def _err(config) -> str:
    with pytest.raises(HybridlabError) as info:
        cfg.validate(config)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_repository_config_is_valid_for_every_scale(base):
    for scale in cfg.SCALES:
        c = copy.deepcopy(base)
        c["scale"] = scale
        view = cfg.resolve(cfg.validate(c))
        assert view["scale"] == scale
        assert view["data"]["seq_len"] == base["presets"][scale]["data"]["seq_len"]


def test_unknown_top_level_key(base):
    c = copy.deepcopy(base)
    c["learning_rate"] = 1
    msg = _err(c)
    assert "unknown key 'learning_rate'" in msg and "presets" in msg


def test_unknown_nested_key_names_full_path(base):
    c = copy.deepcopy(base)
    c["presets"]["tiny"]["data"]["seqlen"] = 10
    msg = _err(c)
    assert "presets.tiny.data.seqlen" in msg and "seq_len" in msg


def test_unknown_placement_lists_allowed(base):
    c = copy.deepcopy(base)
    c["experiments"]["distill"]["placements"] = ["standard_periodic", "zigzag"]
    msg = _err(c)
    assert "experiments.distill.placements[1]" in msg and "'zigzag'" in msg
    assert "reverse_periodic" in msg and "endpoint_spread" in msg


def test_unknown_scale(base):
    c = copy.deepcopy(base)
    c["scale"] = "huge"
    msg = _err(c)
    assert "scale" in msg and "smoke, tiny, paper" in msg


def test_bad_language_code_syntax(base):
    c = copy.deepcopy(base)
    c["presets"]["tiny"]["data"]["parallel_languages"][0] = "french"
    msg = _err(c)
    assert "presets.tiny.data.parallel_languages[0]" in msg and "tel_Telu" in msg


def test_unknown_language_code(base):
    c = copy.deepcopy(base)
    c["languages"]["flores_paper"][0] = "xyz_Latn"
    msg = _err(c)
    assert "languages.flores_paper[0]" in msg and "xyz_Latn" in msg


def test_wrong_type(base):
    c = copy.deepcopy(base)
    c["presets"]["smoke"]["data"]["seq_len"] = "long"
    msg = _err(c)
    assert "presets.smoke.data.seq_len" in msg and "integer" in msg


def test_gap_weights_must_match_gaps(base):
    c = copy.deepcopy(base)
    c["presets"]["smoke"]["data"]["spaced_retrieval"]["gap_weights"] = [1.0]
    assert "gap_weights" in _err(c)


@pytest.mark.parametrize("key, value, message", [
    ("freeze_until_updates", [240],
     "config: presets.tiny: experiments.bld_sr.freeze_until_updates has 240, not before the run's end at 240 "
     "updates (train.bld_sr.steps); lower it or train longer"),
    ("freeze_windows_updates", [[230, 20]],
     "config: presets.tiny: experiments.bld_sr.freeze_windows_updates has [230, 20]: a window of w >= 1 updates "
     "from update s must end by the run's 240 updates (train.bld_sr.steps); fix s or w"),
    ("freeze_windows_updates", [[5, 0]],
     "config: presets.tiny: experiments.bld_sr.freeze_windows_updates has [5, 0]: a window of w >= 1 updates "
     "from update s must end by the run's 240 updates (train.bld_sr.steps); fix s or w"),
    ("score_updates", [10, 300],
     "config: presets.tiny: experiments.bld_sr.score_updates has 300, past the run's 240 updates "
     "(train.bld_sr.steps); lower it or train longer"),
    ("freeze_until_updates", [0],
     "presets.tiny.experiments overrides: config: experiments.bld_sr.freeze_until_updates[0] = 0 is out of range "
     "(minimum 1)"),
    ("freeze_windows_updates", [[5]],
     "presets.tiny.experiments overrides: config: experiments.bld_sr.freeze_windows_updates[0] has 1 items "
     "(minItems 2)"),
])
def test_bld_sr_freeze_updates_must_fit_the_run_one_line(base, key, value, message):
    """Freeze starts and score checkpoints in updates are checked against the preset's train.bld_sr.steps."""
    c = copy.deepcopy(base)
    c["presets"]["tiny"]["experiments"]["bld_sr"][key] = value
    assert _err(c) == message


def test_fa_ratio_giving_no_attention_layer(base):
    c = copy.deepcopy(base)
    c["experiments"]["distill"]["fa_ratio"] = 0.05
    assert "full-attention layers" in _err(c)


def test_config_hash_is_stable_and_sensitive(base):
    view = cfg.resolve(cfg.validate(copy.deepcopy(base)))
    assert cfg.config_hash(view) == cfg.config_hash(copy.deepcopy(view))
    view["seed"] += 1
    assert cfg.config_hash(view) != cfg.config_hash(cfg.resolve(base))


def test_cli_prints_one_line_error(tmp_path, base):
    c = copy.deepcopy(base)
    c["experiments"]["distill"]["mixers"] = ["mamba"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(c))
    proc = subprocess.run([sys.executable, "-m", "hybridlab.cli", "config", "--configfile", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert "experiments.distill.mixers[0]" in proc.stderr and "gdn, kda, gla" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_snakemake_stops_with_one_line_on_bad_config(tmp_path):
    """The DAG validates before building any job: `--config scale=huge` fails with the allowed values."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "data", "--config", "scale=huge"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "config: scale = 'huge' is not allowed (allowed: smoke, tiny, paper, rehearsal, real)" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("seeds, fragment", [
    ([], "is not a non-empty list"),
    (3, "is not a non-empty list"),
    ([0, "1"], "has '1', not an integer >= 0"),
    ([0, -1], "has -1, not an integer >= 0"),
    ([True], "has True, not an integer >= 0"),
    ([0, 1, 1], "lists seed 1 twice"),
])
def test_bad_seeds_are_one_line_errors_with_the_fix(base, seeds, fragment):
    for where in ("experiments", "presets"):
        c = copy.deepcopy(base)
        if where == "experiments":
            c["experiments"]["bld_sr"]["seeds"] = seeds
            key = "experiments.bld_sr.seeds"
        else:
            c["presets"]["tiny"].setdefault("experiments", {})["distill"] = {"seeds": seeds}
            key = "presets.tiny.experiments.distill.seeds"
        msg = _err(c)
        assert msg.startswith(f"config: {key}") and fragment in msg and "e.g. seeds: [0, 1, 2]" in msg


def test_experiment_seeds_per_preset(base):
    got = {}
    for scale in cfg.SCALES:
        view = cfg.resolve(cfg.validate({**copy.deepcopy(base), "scale": scale}))
        got[scale] = {e: cfg.experiment_seeds(view, e) for e in cfg.SEEDED_EXPERIMENTS}
    assert got["smoke"] == {"distill": [0], "bld_sr": [0], "bld_nl": [0]}
    assert got["tiny"]["bld_sr"] == got["tiny"]["distill"] == [0, 1, 2]
    assert got["paper"] == {"distill": [0, 1, 2], "bld_sr": [0, 1, 2], "bld_nl": [0, 1, 2]}
    assert got["rehearsal"]["bld_sr"] == [0, 1]
    # without `seeds` an experiment runs once, with the top-level seed
    c = copy.deepcopy(base)
    del c["experiments"]["bld_nl"]["seeds"]
    c["presets"]["tiny"]["experiments"].pop("bld_nl", None)
    assert cfg.experiment_seeds(cfg.resolve(cfg.validate(c)), "bld_nl") == [c["seed"]]


def _set(path: str, value):
    def apply(c):
        *parents, last = path.split(".")
        node = c
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
    return apply


_DELETE = object()


@pytest.mark.parametrize("path, value, message", [
    ("presets.tiny.data.seqlen", 1,
     "config: unknown key 'presets.tiny.data.seqlen' (allowed here: bld_nl_stream, english_bible_docs, english_share, "
     "english_web, english_web_docs, fineweb2_docs_per_language, flores_split, heldout, max_mono_docs_per_language, "
     "max_parallel_sentences, min_parallel_sentences, mixture_tokens, mono_languages, ntrex_sentences_per_doc, "
     "packing, parallel_languages, "
     "sentences_per_doc, seq_len, source, spaced_retrieval, tokenizer_vocab_size, tokenizers, val_fraction)"),
    ("experiments.bld_nl.pattern", _DELETE,
     "config: missing key 'pattern' in experiments.bld_nl (required: mixers, pattern, freeze_fraction, "
     "optimizer_after_unfreeze, freeze_scope)"),
    ("experiments.bld_sr.optimizer_after_unfreeze", "sgd",
     "config: experiments.bld_sr.optimizer_after_unfreeze = 'sgd' is not allowed (allowed: adamw, muon, None)"),
    ("presets.tiny.data.mono_languages.0", "telugu",
     "config: presets.tiny.data.mono_languages[0] = 'telugu' is not a language code; use ISO 639-3 + '_' + "
     "ISO 15924 script, e.g. 'tel_Telu'"),
    ("presets.smoke.train.distill.table_rows_per_language", "all",
     "config: presets.smoke.train.distill.table_rows_per_language must be of type ['integer', 'null'], got str 'all'"),
    ("presets.tiny.data.english_share", 1.0,
     "config: presets.tiny.data.english_share = 1.0 is out of range (exclusiveMaximum 1)"),
    ("presets.tiny.data.seq_len", 4, "config: presets.tiny.data.seq_len = 4 is out of range (minimum 8)"),
    ("experiments.distill.mixers", ["gdn", "gdn"],
     "config: experiments.distill.mixers has duplicate entries: ['gdn', 'gdn']"),
    ("experiments.bld_sr.freeze_windows", [[0.1]],
     "config: experiments.bld_sr.freeze_windows[0] has 1 items (minItems 2)"),
    ("presets.paper.eval.analysis.softcka.rff_features", 3,
     "config: presets.paper.eval.analysis.softcka.rff_features: 3 is not a multiple of 2"),
    ("presets.tiny.eval.analysis.niah.prompts", "oneruler",
     "config: missing key 'oneruler_dir' in presets.tiny.eval.analysis.niah (required: oneruler_dir)"),
    ("presets.tiny.train.distill.stage1.token_budget", 10,
     "config: presets.tiny.train.distill.stage1: {'steps': 12, 'micro_batch_size': 8, 'lr': 0.003, 'warmup_steps': 2, "
     "'grad_clip': None, 'token_budget': 10} is valid under each of {'required': ['token_budget']}, {'required': ['steps']}"),
    ("presets.tiny.experiments.bld_nl", {"mixers": ["mamba"]},
     "presets.tiny.experiments overrides: config: experiments.bld_nl.mixers[0] = 'mamba' is not allowed "
     "(allowed: gdn, kda, gla)"),
])
def test_structure_errors_are_exact_one_liners(base, path, value, message):
    """One message per kind of schema error (the wording predates the generated schema; keep it)."""
    c = copy.deepcopy(base)
    _set(path, value)(c)
    assert _err(c) == message


def test_searched_placements_need_the_layer_importance_section(base):
    c = copy.deepcopy(base)
    del c["presets"]["tiny"]["eval"]["layer_importance"]
    assert "presets.tiny runs searched placements but has no eval.layer_importance" in _err(c)
    c = copy.deepcopy(base)
    c["presets"]["tiny"]["experiments"]["distill"] = {"placements": ["standard_periodic", "searched_latin"]}
    c["presets"]["tiny"]["eval"]["layer_importance"]["languages"] = ["zho_Hans"]
    assert "searched_latin but eval.layer_importance.languages has no latin language" in _err(c)
    c["presets"]["tiny"]["eval"]["layer_importance"]["languages"] = ["yor_Latn"]
    assert "layer_importance.languages ['yor_Latn'] are not in data.parallel_languages" in _err(c)


def test_a_shared_stage1_needs_teacher_inputs_and_no_global_clip(base):
    c = copy.deepcopy(base)
    c["presets"]["tiny"]["train"]["distill"]["stage1"]["grad_clip"] = 1.0
    assert _err(c).startswith("config: presets.tiny.train.distill.stage1.grad_clip couples the layers")
    c = copy.deepcopy(base)
    c["presets"]["tiny"]["train"]["distill"]["stage1_inputs"] = "student"
    assert "presets.tiny.train.distill.stage1_inputs is 'student'" in _err(c)
    c["experiments"]["distill"]["stage1"] = "per_placement"  # one stage 1 per placement takes either
    c["presets"]["tiny"]["train"]["distill"]["stage1"]["grad_clip"] = 1.0
    cfg.validate(c)


def _toy_presets(**presets) -> dict:
    return {"presets": presets}


def test_a_derived_preset_merges_maps_replaces_the_rest_and_unsets_named_keys():
    parent = {"data": {"seq_len": 64, "langs": ["fra_Latn", "zho_Hans"], "sr": {"t": 5, "gaps": [8, 32]}},
              "train": {"sizes": {"xs": {"hidden_size": 32}, "1.4m": {"hidden_size": 128}}, "lr": 1.0e-3},
              "eval": {"clip": 1.0}}
    child = {"derives_from": "base", "unset": ["train.sizes.1.4m", "eval"],
             "data": {"langs": ["rus_Cyrl"], "sr": {"gaps": [16]}}, "train": {"lr": None}}
    grandchild = {"derives_from": "child", "unset": ["train.sizes"], "train": {"sizes": {"s": {"hidden_size": 8}}}}
    raw = _toy_presets(base=parent, child=child, grandchild=grandchild)
    before = copy.deepcopy(raw)
    out = cfg.expand_presets(raw)["presets"]
    assert raw == before  # the input is not changed
    assert out["base"] == parent
    assert out["child"] == {"data": {"seq_len": 64, "langs": ["rus_Cyrl"], "sr": {"t": 5, "gaps": [16]}},
                            "train": {"sizes": {"xs": {"hidden_size": 32}}, "lr": None}}
    assert out["grandchild"] == {"data": out["child"]["data"], "train": {"sizes": {"s": {"hidden_size": 8}},
                                                                         "lr": None}}
    assert cfg.expand_presets(cfg.expand_presets(raw)) == cfg.expand_presets(raw)


@pytest.mark.parametrize("presets, message", [
    ({"a": {"derives_from": "b"}}, "config: presets.a.derives_from = 'b' is not another preset of this config; "
                                   "name one of "),
    ({"a": {"derives_from": "a"}}, "config: presets.a.derives_from = 'a' is not another preset"),
    ({"a": {"derives_from": "b"}, "b": {"derives_from": "a"}},
     "config: presets.b.derives_from: the presets derive in a loop (a -> b -> a)"),
    ({"a": {"x": 1}, "b": {"derives_from": "a", "unset": ["y"]}},
     "config: presets.b.unset names 'y', which presets.a does not set; fix the path or remove it"),
    ({"a": {"x": {"y": 1}}, "b": {"derives_from": "a", "unset": "x.y"}}, "config: presets.b.unset = 'x.y' is not a "
                                                                         "list of dotted key paths"),
    ({"a": {"x": 1, "unset": ["x"]}}, "config: presets.a.unset removes inherited keys, but the preset derives from "
                                      "none"),
])
def test_a_bad_derivation_is_one_line_naming_the_key(presets, message):
    with pytest.raises(HybridlabError) as err:
        cfg.expand_presets(_toy_presets(**presets))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_repository_presets_derive_and_the_cli_prints_both_forms(capsys):
    from hybridlab import cli

    written = yaml.safe_load((ROOT / "config.yaml").read_text())["presets"]
    assert {s: p.get("derives_from") for s, p in written.items()} == {
        "smoke": None, "tiny": "smoke", "paper": None, "rehearsal": "paper", "real": "tiny"}
    full = cfg.load(ROOT / "config.yaml")["presets"]
    # a derived preset states less than it resolves to, and a key it leaves out is its parent's
    assert len(_json_lines(written["tiny"])) < len(_json_lines(full["tiny"]))
    assert "lr" not in written["tiny"]["train"]["distill"]["stage1"]
    assert full["tiny"]["train"]["distill"]["stage1"]["lr"] == full["smoke"]["train"]["distill"]["stage1"]["lr"]
    assert "bld_nl" not in full["real"]["train"] and "token_budget" not in full["rehearsal"]["train"]["distill"]["stage1"]
    assert cli.main(["config", "--scale", "real"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["derives_from"] == ["tiny", "smoke"] and shown["preset"] == written["real"]
    assert cli.main(["config", "--scale", "real", "--resolved"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["train"]["distill"] == full["real"]["train"]["distill"] and "derives_from" not in resolved
    assert resolved["config_hash"] == shown["config_hash"]


def _json_lines(obj) -> list[str]:
    return json.dumps(obj, indent=1).splitlines()
