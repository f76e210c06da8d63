import huggingface_hub.constants
import pytest
from transformers import AutoTokenizer

from hybridlab.data.tokenizer import EOT, load_tokenizer, train_bpe
from hybridlab.errors import HybridlabError

SAMPLES = [
    "The quick brown fox jumps over the lazy dog.",
    "नमस्ते दुनिया, यह एक परीक्षण है।",  # Devanagari with virama and danda
    "สวัสดีชาวโลก นี่คือการทดสอบ",  # Thai, no spaces between words
    "你好，世界。这是一个测试。日本語のテキストも。",  # CJK
    "مرحبا بالعالم، هذا اختبار.",  # Arabic (RTL)
    "emoji 😀🎉👩‍👩‍👧 flags 🇫🇷 and combining e\u0301",  # ZWJ sequences, regional indicators, NFD
]
CORPUS = SAMPLES * 20 + [f"line {i} of english filler text" for i in range(50)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    return out, train_bpe(iter(CORPUS), vocab_size=600, min_frequency=2, out_path=out)


def test_training_is_byte_identical(trained, tmp_path):
    out, _ = trained
    train_bpe(list(CORPUS), vocab_size=600, min_frequency=2, out_path=tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("text", SAMPLES + ["unseen: ქართული ᎣᏏᏲ 𓀀 \t\n  double  spaces "])
def test_round_trip_multilingual(trained, text):
    _, tok = trained
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.eos_token_id not in ids  # encode adds no special tokens


def test_special_token_and_merges(trained):
    _, tok = trained
    assert tok.convert_tokens_to_ids(EOT) == 0
    assert tok.eos_token_id == tok.bos_token_id == tok.pad_token_id == 0
    # merges learned: a frequent word costs fewer tokens than its UTF-8 bytes
    for text in SAMPLES:
        assert len(tok.encode(text)) < len(text.encode("utf-8"))
    assert len(tok.encode(SAMPLES[0])) < len(SAMPLES[0]) / 3


def test_load_from_dir_file_and_auto(trained):
    out, tok = trained
    text = SAMPLES[3]
    for loaded in (load_tokenizer(out), load_tokenizer(out / "tokenizer.json"), AutoTokenizer.from_pretrained(str(out))):
        assert loaded.encode(text) == tok.encode(text)
        assert loaded.eos_token == EOT


def test_load_errors(tmp_path, monkeypatch):
    with pytest.raises(HybridlabError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(HybridlabError, match="not a valid tokenizer.json"):
        load_tokenizer(bad)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HybridlabError, match="no-such-org/no-such-model"):
        load_tokenizer("no-such-org/no-such-model")


def test_train_validation(tmp_path):
    with pytest.raises(HybridlabError, match="vocab_size"):
        train_bpe(CORPUS, vocab_size=200, min_frequency=1, out_path=tmp_path)
    with pytest.raises(HybridlabError, match="no training texts"):
        train_bpe([], vocab_size=300, min_frequency=1, out_path=tmp_path / "x")


def test_teacher_key_and_name_are_inverse():
    from hybridlab.data.tokenizer import teacher_key, teacher_name

    assert teacher_key("Qwen/Qwen3-4B") == "Qwen--Qwen3-4B"
    assert teacher_name("Qwen--Qwen3-4B") == "Qwen/Qwen3-4B"
    assert teacher_name(teacher_key("ibm-granite/granite-4.0-h-micro")) == "ibm-granite/granite-4.0-h-micro"
