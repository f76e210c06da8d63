"""Token ids and token budget are checked against the model and the mixture before any update."""

import numpy as np
import polars as pl
import pytest
import torch

from hybridlab.data.budget import check_budget, check_mixture_vocab, check_token_ids, check_train_data, mixture_max_id
from hybridlab.data.packing import PackedDataset, pack_mixture, write_packed
from hybridlab.errors import HybridlabError

GRANITE_VOCAB = 100352  # Granite-4.x embedding rows
QWEN_MAX_ID = 151643  # Qwen3's <|endoftext|>: its ids reach ~151K


class RangeTokenizer:
    """Test double for a model's own tokenizer: word w becomes id (7919 w) mod (vocab - 1), always < vocab."""

    def __init__(self, vocab: int, eos: int):
        self.vocab, self.eos_token_id = vocab, eos

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[(int(w) * 7919) % (self.vocab - 1) for w in t.split()] for t in texts]}


def _docs(n=80, words=40, seed=0):
    rng = np.random.default_rng(seed)
    return pl.DataFrame([{"doc_id": f"d{k:03d}", "lang": "eng_Latn", "source": "t",
                          "text": " ".join(str(x) for x in rng.integers(0, 10**6, words))} for k in range(n)])


def _mixture(tmp_path, tok, name, seq_len=32, total=32 * 64):
    mix = pack_mixture(_docs(), tok, languages=[], english_share=1.0, seq_len=seq_len, total_tokens=total,
                       val_fraction=0.1, seed=0)
    write_packed(tmp_path / name, mix)
    return tmp_path / name


def test_check_token_ids_and_budget_messages():
    check_token_ids(99, 100, "x")
    with pytest.raises(HybridlabError, match=r"^teacher: the mixture holds token id 100 but the model has 100 "
                                             r"embedding rows; build the mixture with this model's own tokenizer$"):
        check_token_ids(100, 100, "teacher")
    assert check_budget("x", 500, 1000) == pytest.approx(0.5)
    msg = (r"^bld_nl 180m needs 3.6e9 tokens \(20 tokens/param\) but the mixture holds 1.7e8; "
           r"raise data.mixture_tokens or set epochs: 22$")
    with pytest.raises(HybridlabError, match=msg):
        check_budget("bld_nl 180m", 3_600_000_000, 170_000_000, why="20 tokens/param", fix="raise data.mixture_tokens")
    # an explicit epochs count allows up to that many passes, and no more
    assert check_budget("x", 2500, 1000, epochs=3) == pytest.approx(2.5)
    with pytest.raises(HybridlabError, match=r"x needs 2500 tokens but epochs: 2 of the mixture hold 2000; .* epochs: 3$"):
        check_budget("x", 2500, 1000, epochs=2)


def _granite(vocab=GRANITE_VOCAB):
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(0)
    cfg = GraniteConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                        logits_scaling=8.0, tie_word_embeddings=True, eos_token_id=0, pad_token_id=0, bos_token_id=0)
    return GraniteForCausalLM(cfg)


def test_granite_teacher_trains_on_its_own_tokens_and_rejects_qwen_tokens(tmp_path):
    own = _mixture(tmp_path, RangeTokenizer(GRANITE_VOCAB, eos=0), "granite4")
    qwen = _mixture(tmp_path, RangeTokenizer(QWEN_MAX_ID + 1, eos=QWEN_MAX_ID), "qwen3")
    model = _granite()
    assert mixture_max_id(own) < GRANITE_VOCAB <= mixture_max_id(qwen)

    rows = PackedDataset(own, "train")
    check_train_data(own, model, what="teacher granite", need_tokens=4 * 8 * rows.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = torch.stack([rows[i] for i in range(8)])
    assert int(batch.max()) < GRANITE_VOCAB
    losses = []
    for _ in range(4):
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and losses[-1] < losses[0]

    # Qwen-tokenised data: one line before any update (on CUDA it would be a device-side assert)
    with pytest.raises(HybridlabError, match=rf"^teacher granite: the mixture holds token id {QWEN_MAX_ID} but the "
                                             rf"model has {GRANITE_VOCAB} embedding rows; build the mixture with "
                                             r"this model's own tokenizer$"):
        check_train_data(qwen, model, what="teacher granite", need_tokens=32)
    with pytest.raises(HybridlabError, match="teacher granite needs"):
        check_train_data(own, model, what="teacher granite", need_tokens=10**9)


def test_max_id_scanned_when_stats_lack_it(tmp_path):
    d = _mixture(tmp_path, RangeTokenizer(5000, eos=0), "m")
    import json

    stats = json.loads((d / "stats.json").read_text())
    recorded = stats.pop("max_token_id")
    (d / "stats.json").write_text(json.dumps(stats))
    assert mixture_max_id(d) == recorded == int(np.load(d / "tokens.npy").max())
    small = _granite(vocab=recorded)
    with pytest.raises(HybridlabError, match=f"token id {recorded} but the model has {recorded} embedding rows"):
        check_mixture_vocab(d, small, "distill stage 1")


def test_english_mixture_streams_until_the_bld_nl_budget(tmp_path):
    """pack_mixture.py with `stream`: a local DCLM-layout directory is read until the largest arm's budget
    (counted with the tokenizer's vocabulary) is packed, and bld_nl.bld_nl_need_tokens matches training's count."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from hybridlab.data.tokenizer import train_bpe
    from hybridlab.train import bld_nl

    words = "the cat sat on a mat while rain fell over old hills and dogs ran home".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, 60)) for _ in range(400)]
    shard = tmp_path / "dclm" / "global-shard_01_of_10" / "local-shard_0_of_10"  # DCLM's own layout
    shard.mkdir(parents=True)
    pl.DataFrame({"text": texts}).write_ndjson(shard / "shard_00000000_processed.jsonl")
    tok = train_bpe(texts, vocab_size=300, min_frequency=2, out_path=tmp_path / "tok")
    shape = {"hidden_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
             "head_dim": 8, "intermediate_size": 32}
    run = {"context_len": 64, "tokens_per_param": 1, "micro_batch_size": 2, "lr": 1e-3, "eval_every": 4}
    exp = {"mixers": ["gdn"], "pattern": ["full_attention", "mixer", "mixer", "mixer"], "freeze_fraction": 0.5,
           "optimizer_after_unfreeze": "adamw", "freeze_scope": "block"}
    need = bld_nl.bld_nl_need_tokens({"xs": shape}, run, exp, vocab_size=len(tok))
    model = bld_nl.build_nope_hybrid(shape, pattern=exp["pattern"], mixer="gdn", vocab_size=len(tok), context_len=64,
                                     eos_id=0, seed=0)
    assert need == {"gdn-xs": bld_nl.total_steps(run, bld_nl.count_parameters(model)) * 2 * 64}

    params = {"languages": [], "english": "eng_Latn", "english_share": 1.0, "seq_len": 32, "total_tokens": 10**9,
              "block_rows": 2, "val_fraction": 0.05, "seed": 0,
              "stream": {"source": "dclm", "path": str(tmp_path / "dclm")},
              "bld_nl": {"sizes": {"xs": shape}, "run": run, "experiment": exp}}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "workflow_scripts/pack_mixture.py"), "--params",
                           json.dumps(params), "--mono", "unused", "--tokenizer", str(tmp_path / "tok"), "--out",
                           str(tmp_path / "mix")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads((tmp_path / "mix" / "stats.json").read_text())
    rows = -(-need["gdn-xs"] // 32)
    rows += rows % 2  # whole blocks of 2 rows
    assert stats["train_tokens"] == rows * 32 >= need["gdn-xs"] and stats["block_rows"] == 2
    check_train_data(tmp_path / "mix", model, what="bld_nl gdn-xs", need_tokens=need["gdn-xs"])
