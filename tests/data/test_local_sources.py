"""Config keys for local copies: language resolution per dataset, model directories, job environment."""

import copy
import json
from pathlib import Path

import pytest

from hybridlab import config as cfgmod
from hybridlab.data import languages
from hybridlab.data.languages import Language, dataset_config
from hybridlab.data.local_sources import (
    MODEL_DIRS_ENV,
    check_hub_languages,
    job_environment,
    local_sources,
    resolve_model_source,
)
from hybridlab.errors import HybridlabError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return cfgmod.load(ROOT / "config.yaml")


def test_every_language_of_every_preset_resolves_in_every_dataset_it_uses(config):
    english = config["languages"]["english"]
    assert {"smoke", "tiny", "paper"} <= set(config["presets"])
    for scale, preset in config["presets"].items():
        data = preset["data"]
        # the hub reads parallel + English from FLoRes+ (or FLORES-200) and mono from FineWeb-2; offline
        # presets are checked too, since the rehearsal builds hub-layout copies from their corpus
        for code in {english, *data["parallel_languages"]}:
            assert dataset_config(code, "flores_plus") and dataset_config(code, "flores200"), (scale, code)
        for code in set(data["mono_languages"]) - {english}:
            assert dataset_config(code, "fineweb2"), (scale, code)
    paper = config["presets"]["paper"]["data"]
    got = {c: (dataset_config(c, "flores_plus"), dataset_config(c, "fineweb2")) for c in ("zho_Hans", "pes_Arab")}
    assert "zho_Hans" in paper["parallel_languages"] and "pes_Arab" in paper["mono_languages"]
    assert got == {"zho_Hans": ("cmn_Hans", "cmn_Hani"), "pes_Arab": ("pes_Arab", "fas_Arab")}
    check_hub_languages(config)  # the real config passes


def _hub_config(config, **data):
    c = copy.deepcopy(config)
    c["presets"]["paper"]["data"].update(data)
    return c


def test_a_language_a_dataset_lacks_is_one_line_at_validation(config, monkeypatch):
    # FineWeb-2 lacks a (registered) language: fake one without a FineWeb-2 config
    fake = Language("xyz_Latn", "xyz", "Latn", "Test", (), "xyz_Latn", None, "xyz_Latn")
    monkeypatch.setitem(languages.LANGUAGES, "xyz_Latn", fake)
    bad = _hub_config(config, mono_languages=["tel_Telu", "xyz_Latn"])
    with pytest.raises(HybridlabError) as info:
        cfgmod.validate(bad)
    msg = str(info.value)
    assert "presets.paper.data.mono_languages" in msg and "FineWeb-2" in msg and "xyz_Latn" in msg
    assert "\n" not in msg
    # English in the mono list is fine (it comes from FineWeb/DCLM), in FineWeb-2 directly it is not
    check_hub_languages(_hub_config(config, mono_languages=["eng_Latn", "tel_Telu"]))
    with pytest.raises(HybridlabError, match=r"FineWeb-2 \(HuggingFaceFW/fineweb-2\) has no language eng_Latn"):
        dataset_config("eng_Latn", "fineweb2")
    # two project languages sharing FineWeb-2's one Mandarin config
    with pytest.raises(HybridlabError, match="zho_Hans and zho_Hant are the same config 'cmn_Hani'"):
        cfgmod.validate(_hub_config(config, mono_languages=["zho_Hans", "zho_Hant"]))
    # both parallel sources at once
    both = copy.deepcopy(config)
    both["presets"]["paper"]["local_sources"] = {"flores_plus": "/a", "flores200": "/b"}
    with pytest.raises(HybridlabError, match="both flores_plus and flores200"):
        cfgmod.validate(both)


def test_schema_accepts_the_keys_and_rejects_unknown_ones(config):
    ok = copy.deepcopy(config)
    ok["presets"]["paper"]["local_sources"] = {
        "flores_plus": "/data/flores_plus", "flores200": None, "fineweb2": "/data/fineweb-2", "fineweb": "/data/fw",
        "dclm": "/data/dclm", "models": {"Qwen/Qwen3-4B": "/models/qwen3-4b"}, "hf_home": "/data/hf",
        "hf_offline": True}
    cfgmod.validate(ok)
    bad = copy.deepcopy(config)
    bad["presets"]["paper"]["local_sources"] = {"flores_path": "/x"}
    with pytest.raises(HybridlabError, match="unknown key 'presets.paper.local_sources.flores_path'"):
        cfgmod.validate(bad)


def test_job_environment_and_defaults(tmp_path):
    assert job_environment({}) == {}
    assert local_sources({}) == {"flores_plus": None, "flores200": None, "fineweb2": None, "fineweb": None,
                                 "dclm": None, "ntrex128": None, "pg19": None, "hf_home": None, "models": {},
                                 "hf_offline": False}
    env = job_environment({"local_sources": {"hf_home": str(tmp_path / "hf"), "hf_offline": True,
                                             "models": {"org/m": "/models/m"}}})
    assert env == {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "TRANSFORMERS_OFFLINE": "1", MODEL_DIRS_ENV: json.dumps({"org/m": "/models/m"})}


def test_resolve_model_source(tmp_path, monkeypatch):
    local = tmp_path / "qwen"
    local.mkdir()
    view = {"models": {"teachers": ["Qwen/Qwen3-4B"]},  # a view's own `models` is the model shapes
            "local_sources": {"models": {"Qwen/Qwen3-4B": str(local), "org/gone": str(tmp_path / "gone")}}}
    assert resolve_model_source("Qwen/Qwen3-4B", view) == str(local)
    assert resolve_model_source("Qwen/Qwen3-4B", view["local_sources"]) == str(local)
    assert resolve_model_source("ibm-granite/granite-4.1-3b", view) == "ibm-granite/granite-4.1-3b"
    assert resolve_model_source("Qwen/Qwen3-4B", {"models": {"teachers": []}}) == "Qwen/Qwen3-4B"
    with pytest.raises(HybridlabError, match="maps 'org/gone' to .* which is not a directory"):
        resolve_model_source("org/gone", view)
    # inside a job: the mapping the rules exported
    monkeypatch.delenv(MODEL_DIRS_ENV, raising=False)
    assert resolve_model_source("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    monkeypatch.setenv(MODEL_DIRS_ENV, json.dumps({"Qwen/Qwen3-4B": str(local)}))
    assert resolve_model_source("Qwen/Qwen3-4B") == str(local)
    monkeypatch.setenv(MODEL_DIRS_ENV, "{not json")
    with pytest.raises(HybridlabError, match="is not JSON"):
        resolve_model_source("Qwen/Qwen3-4B")


def test_model_loaders_use_the_mapping(tmp_path, monkeypatch):
    """A hub id mapped to a local directory loads from there (tokenizer and causal LM), never the hub."""
    import transformers

    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.models.registry import load_causal_lm, load_tokenizer_for

    tok_dir = tmp_path / "tok"
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "<|endoftext|>": 3}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(tok_dir)
    model_dir = tmp_path / "model"
    from tiny_models import tiny_qwen3

    tiny_qwen3(vocab_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=1, head_dim=8).save_pretrained(model_dir)
    monkeypatch.setenv(MODEL_DIRS_ENV, json.dumps({"org/tok": str(tok_dir), "org/model": str(model_dir)}))
    assert load_tokenizer("org/tok")("hello world")["input_ids"] == [1, 2]
    assert load_tokenizer_for("org/tok")("world")["input_ids"] == [2]
    assert load_causal_lm("org/model").config.hidden_size == 16


def test_a_missing_local_copy_is_one_line_naming_the_key_the_path_and_the_fix(config, tmp_path):
    from hybridlab.data.local_sources import check_paths

    raw = copy.deepcopy(config)
    raw["scale"] = "real"
    check_paths(cfgmod.resolve(raw))  # the real preset's data/flores200 and data/ntrex128 ship in the repository
    raw["presets"]["real"]["local_sources"]["flores200"] = "/nonexistent"
    with pytest.raises(HybridlabError) as exc:
        check_paths(cfgmod.resolve(raw))
    msg = str(exc.value)
    assert "\n" not in msg and "presets.real.local_sources.flores200: /nonexistent does not exist" in msg
    assert "remove the key" in msg
    raw["presets"]["real"]["local_sources"]["flores200"] = "data/flores200"
    raw["presets"]["real"]["local_sources"]["models"] = {"org/m": str(tmp_path / "absent")}
    with pytest.raises(HybridlabError, match=r"local_sources\.models\.org/m: .*absent does not exist"):
        check_paths(cfgmod.resolve(raw))
    # the paper preset's examples are comments; the rehearsal's copies are written by `make rehearsal` first
    for scale in ("paper", "rehearsal", "tiny"):
        check_paths(cfgmod.resolve({**config, "scale": scale}), root=tmp_path)


def test_hybridlab_config_checks_the_active_presets_local_sources(config, tmp_path, capsys):
    import yaml

    from hybridlab.cli import main

    raw = copy.deepcopy(config)
    raw["presets"]["real"]["local_sources"]["flores200"] = str(ROOT / "data" / "flores200")
    raw["presets"]["real"]["local_sources"]["ntrex128"] = "missing/ntrex128"  # relative: from the config's directory
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    assert main(["config", "--configfile", str(tmp_path / "config.yaml"), "--scale", "tiny"]) == 0
    capsys.readouterr()
    assert main(["config", "--configfile", str(tmp_path / "config.yaml"), "--scale", "real"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "presets.real.local_sources.ntrex128: missing/ntrex128" in err
