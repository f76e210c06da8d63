"""Registry: local loading, one-line errors for hub failures, no network when offline."""

import importlib
import socket

import huggingface_hub.constants
import huggingface_hub.errors as hub_errors
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from tiny_models import tiny_qwen3
from transformers import PreTrainedTokenizerFast

from hybridlab.errors import HybridlabError
from hybridlab.models import registry
from hybridlab.models.registry import _hub_error_line, load_causal_lm, load_tokenizer_for

_http = importlib.import_module(hub_errors.Response.__module__.split(".")[0])


def _response(status):
    return _http.Response(status, request=_http.Request("GET", "https://huggingface.co/org/model"))


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if anything opens a connection."""
    attempts = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError(f"network disabled in tests (tried {address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: attempts.append(a[:2]) or refuse(None, a[:2]))
    return attempts


@pytest.fixture
def tiny_dir(tmp_path):
    model = tiny_qwen3(seed=0, num_attention_heads=4, num_key_value_heads=2, head_dim=8).eval()
    model.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny", model


def test_offline_missing_hub_model_is_one_line_without_network(monkeypatch, tmp_path, no_network):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HybridlabError) as info:
        load_causal_lm("hybridlab-tests/does-not-exist-4b")
    message = str(info.value)
    assert "\n" not in message
    assert "hybridlab-tests/does-not-exist-4b" in message and "local path" in message and "offline" in message
    with pytest.raises(HybridlabError, match="does-not-exist-4b"):
        load_tokenizer_for("hybridlab-tests/does-not-exist-4b")
    assert no_network == []


@pytest.mark.parametrize(
    "exc, expected",
    [
        (hub_errors.GatedRepoError("gated", response=_response(403)), ["is gated", "HF_TOKEN", "huggingface-cli login"]),
        (hub_errors.RepositoryNotFoundError("nope", response=_response(404)), ["not a hub repository", "HF_TOKEN"]),
        (hub_errors.RevisionNotFoundError("rev", response=_response(404)), ["no such revision"]),
        (hub_errors.LocalEntryNotFoundError("cache miss"), ["not in the local Hugging Face cache", "local path"]),
        (hub_errors.HfHubHTTPError("unauthorised", response=_response(401)), ["HTTP 401", "HF_TOKEN"]),
        (ValueError("... set the option `trust_remote_code=True` to remove this error."), ["trust_remote_code=True"]),
    ],
)
def test_hub_exceptions_map_to_one_line(exc, expected):
    # transformers re-raises hub errors as OSError(...) from e; the mapping must look through the chain
    try:
        try:
            raise exc
        except Exception as inner:
            raise OSError("wrapped by transformers") from inner
    except OSError as outer:
        line = _hub_error_line("org/model", outer)
    assert line is not None and "\n" not in line and "org/model" in line
    for fragment in expected:
        assert fragment in line
    assert _hub_error_line("org/model", OSError("disk full")) is None


def test_missing_local_path_is_reported_as_path():
    with pytest.raises(HybridlabError, match="local model path './no/such/dir' does not exist"):
        load_causal_lm("./no/such/dir")


def test_directory_without_config(tmp_path):
    with pytest.raises(HybridlabError, match="has no config.json"):
        load_causal_lm(tmp_path)


def test_bad_dtype():
    with pytest.raises(HybridlabError, match="unknown dtype 'float8'"):
        load_causal_lm("./anything", dtype="float8")


def test_local_directory_loads_and_gets_native_patch(tiny_dir, monkeypatch, no_network):
    path, model = tiny_dir
    seen = []
    import hybridlab.models.native as native

    real_patch = native.patch_model_for_device
    monkeypatch.setattr(native, "patch_model_for_device", lambda m: seen.append(type(m).__name__) or real_patch(m))
    loaded = load_causal_lm(path, dtype="float32")
    ids = torch.randint(0, 64, (1, 7))
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert seen == ["Qwen3ForCausalLM"]
    assert load_causal_lm(str(path), dtype="bf16").dtype == torch.bfloat16
    assert no_network == []


def test_tokenizer_local_and_missing(tiny_dir, tmp_path):
    path, _ = tiny_dir
    with pytest.raises(HybridlabError, match="no tokenizer files"):
        load_tokenizer_for(path)
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(path)
    assert load_tokenizer_for(path)("hello world again").input_ids == [1, 2, 0]


def test_hybrid_directory_is_routed_to_load_hybrid(tiny_dir, monkeypatch):
    path, _ = tiny_dir
    (path / registry.HYBRID_SPEC).write_text("{}")
    calls = []
    import hybridlab.models.io as io

    monkeypatch.setattr(io, "load_hybrid", lambda p, dtype=None, device=None: calls.append((p, dtype, device)) or "hybrid")
    assert load_causal_lm(path, device_map="cpu") == "hybrid"
    assert calls == [(path, None, "cpu")]


def test_saved_hybrid_loads_through_registry(tiny_dir, tmp_path):
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.io import save_hybrid

    _, teacher = tiny_dir
    hybrid = convert_to_hybrid(teacher, [1], "gdn")
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    save_hybrid(hybrid, tmp_path / "hybrid", tokenizer=PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]"))
    assert load_tokenizer_for(tmp_path / "hybrid")("hi there").input_ids == [1, 0]
    loaded = load_causal_lm(tmp_path / "hybrid")
    ids = torch.randint(0, 64, (2, 5))
    assert torch.equal(loaded(ids).logits, hybrid.eval()(ids).logits)
    assert loaded.hybridlab_spec.fa_layers == [1]
