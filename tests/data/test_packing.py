import json
import zlib

import numpy as np
import polars as pl
import pytest
import torch

from hybridlab.data.packing import PackedDataset, pack_documents, pack_mixture, with_parallel_heldout, write_packed
from hybridlab.data.tokenizer import train_bpe
from hybridlab.errors import HybridlabError


class IdTokenizer:
    """Test double: the text "7 7 7" tokenises to [7, 7, 7]; EOS is 0."""

    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        assert add_special_tokens is False
        return {"input_ids": [[int(x) for x in t.split()] for t in texts]}


LANG_BASE = {"eng_Latn": 1000, "fra_Latn": 2000, "tel_Telu": 3000, "bam_Latn": 4000}


def _corpus(n_docs: dict[str, int], seed=0):
    """Doc k of a language is its own token id repeated (5..40 times): provenance is readable from tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for lang, n in n_docs.items():
        for k in range(n):
            tok = LANG_BASE[lang] + k
            rows.append({"doc_id": f"{lang}-{k:04d}", "lang": lang, "text": " ".join([str(tok)] * int(rng.integers(5, 41))), "source": "test"})
    return pl.DataFrame(rows)


KW = dict(languages=["fra_Latn", "tel_Telu"], english_share=0.3, seq_len=32, total_tokens=32 * 100, val_fraction=0.1, seed=0)


def test_pack_documents_exact():
    rows = pack_documents([[1, 2, 3], [4, 5], [6]], seq_len=4, eos_id=0)
    # stream 1 2 3 0 4 5 0 6 0 -> two full rows, the tail [0] is dropped
    assert rows.dtype == np.int32
    assert rows.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6]]
    assert pack_documents([[7] * 6], seq_len=3, eos_id=9).tolist() == [[7, 7, 7], [7, 7, 7]]
    assert pack_documents([], seq_len=5, eos_id=0).shape == (0, 5)


def test_shares_rows_and_single_language_rows():
    mix = pack_mixture(_corpus({"eng_Latn": 300, "fra_Latn": 300, "tel_Telu": 300}), IdTokenizer(), **KW)
    s = mix.stats["languages"]
    # eng: round(0.3*100)=30 rows -> 3 val + 27 train; fra/tel: 35 rows -> round(3.5)=4 val + 31 train
    assert (s["eng_Latn"]["val_rows"], s["eng_Latn"]["train_rows"]) == (3, 27)
    assert (s["fra_Latn"]["val_rows"], s["fra_Latn"]["train_rows"]) == (4, 31)
    assert s["eng_Latn"]["achieved_share"] == pytest.approx(27 / 89)
    for lang, target in [("eng_Latn", 0.3), ("fra_Latn", 0.35), ("tel_Telu", 0.35)]:
        assert s[lang]["target_share"] == pytest.approx(target)
        assert abs(s[lang]["achieved_share"] - target) < 0.02
        assert not s[lang]["short"]
    assert mix.tokens_NS.shape == (100, 32) and mix.tokens_NS.dtype == np.int32
    assert mix.meta["row"].to_list() == list(range(100))
    # every row holds tokens of exactly one language (its own id range) plus EOS
    for row, lang in zip(mix.tokens_NS, mix.meta["lang"]):
        body = row[row != 0]
        assert ((body >= LANG_BASE[lang]) & (body < LANG_BASE[lang] + 1000)).all()
    # train rows are interleaved across languages, val rows grouped
    assert mix.meta.filter(pl.col("split") == "train")["lang"].n_unique() == 3
    assert mix.meta.filter(pl.col("split") == "val")["lang"].to_list() == ["eng_Latn"] * 3 + ["fra_Latn"] * 4 + ["tel_Telu"] * 4


def test_split_is_by_document():
    mix = pack_mixture(_corpus({"eng_Latn": 300, "fra_Latn": 300, "tel_Telu": 300}), IdTokenizer(), **KW)
    is_val = (mix.meta["split"] == "val").to_numpy()
    val_docs = set(np.unique(mix.tokens_NS[is_val])) - {0}
    train_docs = set(np.unique(mix.tokens_NS[~is_val])) - {0}
    assert val_docs and train_docs and not (val_docs & train_docs)


def test_custom_weights_and_scarce_language():
    bam = pl.DataFrame(
        [{"doc_id": f"bam-{k}", "lang": "bam_Latn", "text": " ".join([str(4000 + k)] * 20), "source": "t"} for k in range(6)]
    )
    df = pl.concat([_corpus({"eng_Latn": 300, "fra_Latn": 300}, seed=1), bam])
    kw = {**KW, "languages": ["fra_Latn", "bam_Latn"], "weights": {"fra_Latn": 3.0, "bam_Latn": 1.0}}
    mix = pack_mixture(df, IdTokenizer(), **kw)
    s = mix.stats["languages"]
    assert s["bam_Latn"]["target_share"] == pytest.approx(0.7 / 4)
    assert s["fra_Latn"]["target_share"] == pytest.approx(0.7 * 3 / 4)
    # bam: 6 docs x 21 tokens = 126 -> 3 rows available; val = max(1, round(0.1 * 3)) = 1 row, which takes
    # the first 2 docs (42 tokens >= 32); train gets the other 4 docs (84 tokens) -> 2 rows
    b = s["bam_Latn"]
    assert b["short"] and (b["docs_val"], b["docs_train"]) == (2, 4)
    assert (b["val_rows"], b["train_rows"]) == (1, 2)
    assert b["achieved_share"] == pytest.approx(64 / (64 + s["eng_Latn"]["train_tokens"] + s["fra_Latn"]["train_tokens"]))
    assert not s["fra_Latn"]["short"]
    assert sum(v["achieved_share"] for v in s.values()) == pytest.approx(1.0)


def test_determinism_bytes_and_seed(tmp_path):
    df = _corpus({"eng_Latn": 200, "fra_Latn": 200, "tel_Telu": 200})
    for name in ("a", "b"):
        write_packed(tmp_path / name, pack_mixture(df.sample(fraction=1.0, shuffle=True, seed=len(name) + ord(name)), IdTokenizer(), **KW))
    for f in ("tokens.npy", "meta.parquet", "stats.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    other = pack_mixture(df, IdTokenizer(), **{**KW, "seed": 1})
    assert not np.array_equal(other.tokens_NS, np.load(tmp_path / "a" / "tokens.npy"))


def test_packed_dataset_memmap(tmp_path):
    mix = pack_mixture(_corpus({"eng_Latn": 200, "fra_Latn": 200, "tel_Telu": 200}), IdTokenizer(), **KW)
    write_packed(tmp_path, mix)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["train_tokens"] == 89 * 32 and stats["val_tokens"] == 11 * 32
    train = PackedDataset(tmp_path, "train")
    assert isinstance(train.tokens, np.memmap) and len(train) == 89 and len(train.langs) == 89
    x = train[5]
    assert x.dtype == torch.int64 and x.shape == (32,)
    assert torch.equal(x, torch.from_numpy(mix.tokens_NS[train.rows[5]].astype(np.int64)))
    val_tel = PackedDataset(tmp_path, "val", lang="tel_Telu")
    assert len(val_tel) == 4 and set(val_tel.langs) == {"tel_Telu"}
    assert ((val_tel[0][val_tel[0] != 0] >= 3000)).all()
    batch = next(iter(torch.utils.data.DataLoader(train, batch_size=4)))
    assert batch.shape == (4, 32)
    with pytest.raises(HybridlabError, match="no rows"):
        PackedDataset(tmp_path, "test")
    with pytest.raises(HybridlabError, match="missing"):
        PackedDataset(tmp_path / "nope", "train")


def test_errors():
    df = _corpus({"eng_Latn": 50, "fra_Latn": 50})
    with pytest.raises(HybridlabError, match="non-English"):
        pack_mixture(df, IdTokenizer(), **{**KW, "languages": ["eng_Latn", "fra_Latn"]})
    with pytest.raises(HybridlabError, match="no documents for tel_Telu"):
        pack_mixture(df, IdTokenizer(), **KW)
    with pytest.raises(HybridlabError, match="weights"):
        pack_mixture(df, IdTokenizer(), **{**KW, "languages": ["fra_Latn"], "weights": {"tel_Telu": 1.0}})
    with pytest.raises(HybridlabError, match="none left for training"):
        pack_mixture(df, IdTokenizer(), **{**KW, "languages": ["fra_Latn"], "total_tokens": 64})


def test_with_real_bpe_tokenizer(tmp_path):
    texts = {
        "eng_Latn": [f"The cat number {i} sat on the mat." for i in range(60)],
        "hin_Deva": [f"बिल्ली संख्या {i} चटाई पर बैठी।" for i in range(60)],
    }
    df = pl.DataFrame(
        [{"doc_id": f"{lang}{i}", "lang": lang, "text": t, "source": "x"} for lang, ts in texts.items() for i, t in enumerate(ts)]
    )
    tok = train_bpe([t for ts in texts.values() for t in ts], vocab_size=300, min_frequency=2, out_path=tmp_path / "tok")
    mix = pack_mixture(df, tok, languages=["hin_Deva"], english_share=0.5, seq_len=16, total_tokens=16 * 20, val_fraction=0.2, seed=0)
    hin_row = mix.tokens_NS[mix.meta["lang"].to_list().index("hin_Deva")]
    assert "बिल्ली" in tok.decode(hin_row.tolist()) or "चटाई" in tok.decode(hin_row.tolist())
    assert (mix.tokens_NS == tok.eos_token_id).any()


# ---------------------------------------------------------------------------------------------------------
# Contiguous packing: exact rows and document starts of toy streams, whole-block shuffling, masks.

from hybridlab.data.packing import (  # noqa: E402
    check_row_blocks,
    cu_seqlens,
    document_causal_mask,
    pack_stream,
    position_ids,
    segment_lengths,
)


def test_pack_stream_rows_and_doc_starts_exact():
    # stream: 1 2 3 0 | 4 5 0 6 | 6 6 6 6 | 6 0 7 0 | (8 0 dropped: tail)
    docs = [[1, 2, 3], [4, 5], [6, 6, 6, 6, 6, 6], [7], [8]]
    rows, starts = pack_stream(docs, seq_len=4, eos_id=0)
    assert rows.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6], [6, 6, 6, 6], [6, 0, 7, 0]]
    # doc offsets in the stream: 0, 4, 7, 14, 16 (16 is in the dropped tail)
    assert [s.tolist() for s in starts] == [[0], [0, 3], [], [2]]
    # the long document [6]*6 spans rows 1..3 (consecutive), never split by anything but row cuts
    assert rows[1, 3] == 6 and (rows[2] == 6).all() and rows[3, 0] == 6


def _block_corpus():
    """English only: doc k is (k+1) repeated 7 times -> 8 tokens per doc with EOS."""
    return pl.DataFrame([{"doc_id": f"d{k:02d}", "lang": "eng_Latn", "text": " ".join([str(k + 1)] * 7),
                          "source": "t"} for k in range(40)])


def test_blocks_keep_consecutive_rows_together():
    kw = dict(languages=[], english_share=1.0, seq_len=4, total_tokens=4 * 24, val_fraction=0.1, seed=3)
    mix = pack_mixture(_block_corpus(), IdTokenizer(), block_rows=4, **kw)
    s = mix.stats["languages"]["eng_Latn"]
    # 24 rows: val = round(2.4) = 2 -> whole blocks of 4 -> 4 rows; train 20 rows = 5 blocks
    assert (s["val_rows"], s["train_rows"]) == (4, 20) and mix.stats["block_rows"] == 4
    train = mix.tokens_NS[:20]
    # docs in the language's shuffled order; val takes the first 2 (16 tokens = 4 rows), train the next 10
    order = np.random.default_rng([3, zlib.crc32(b"eng_Latn")]).permutation(40) + 1
    stream_blocks = [[a] * 7 + [0] + [b] * 7 + [0] for a, b in zip(order[2:12:2], order[3:12:2])]
    block_perm = np.random.default_rng(3).permutation(5)
    for j in range(5):
        # block j of the stored rows is stream block block_perm[j]: 16 consecutive tokens, 2 whole docs
        assert train[4 * j:4 * j + 4].reshape(-1).tolist() == stream_blocks[block_perm[j]]
        assert [x.tolist() for x in mix.doc_starts[4 * j:4 * j + 4]] == [[0], [], [0], []]
    assert mix.tokens_NS[20:].reshape(-1).tolist() == [order[0]] * 7 + [0] + [order[1]] * 7 + [0]


def test_block_rows_one_is_the_row_shuffle_and_max_id_recorded():
    kw = dict(languages=[], english_share=1.0, seq_len=4, total_tokens=4 * 24, val_fraction=0.1, seed=3)
    a = pack_mixture(_block_corpus(), IdTokenizer(), **kw)
    order = np.random.default_rng([3, zlib.crc32(b"eng_Latn")]).permutation(40) + 1
    # 24 rows: val 2 rows (1 doc), train 22 rows (11 docs), rows shuffled one by one
    stream = np.array([t for d in order[1:12] for t in [d] * 7 + [0]]).reshape(22, 4)
    perm = np.random.default_rng(3).permutation(22)
    assert a.tokens_NS[:22].tolist() == stream[perm].tolist()
    assert a.stats["max_token_id"] == int(max(order[:12]))


def test_doc_starts_written_and_read_back(tmp_path):
    kw = dict(languages=[], english_share=1.0, seq_len=4, total_tokens=4 * 24, val_fraction=0.1, seed=3)
    mix = pack_mixture(_block_corpus(), IdTokenizer(), block_rows=4, **kw)
    write_packed(tmp_path, mix)
    train = PackedDataset(tmp_path, "train")
    assert train.block_rows == 4 and train.eos_id == 0
    for i in range(len(train)):
        assert train.doc_starts(i).tolist() == mix.doc_starts[train.rows[i]].tolist()
        # a start is exactly the first token after an EOS (or row position 0 after the previous row's EOS)
        row = train[i].numpy()
        for s in train.doc_starts(i):
            assert s == 0 or row[s - 1] == 0
    check_row_blocks(train, 4, "test")
    check_row_blocks(train, 2, "test")
    with pytest.raises(HybridlabError, match="joins 3 packed rows but .* blocks of 4"):
        check_row_blocks(train, 3, "test")
    write_packed(tmp_path / "one", pack_mixture(_block_corpus(), IdTokenizer(), **kw))
    with pytest.raises(HybridlabError, match="bld_nl x: a sequence joins 4 packed rows"):
        check_row_blocks(PackedDataset(tmp_path / "one", "train"), 4, "bld_nl x")


def test_document_mask_helpers_exact():
    # T = 6, documents start at 0 and 4 -> segments [0,4), [4,6)
    assert segment_lengths([0, 4], 6).tolist() == [4, 2]
    assert position_ids([0, 4], 6).tolist() == [0, 1, 2, 3, 0, 1]
    # a row that continues a document from the previous row (no start at 0): [0,2) [2,6)
    assert segment_lengths([2], 6).tolist() == [2, 4]
    assert position_ids([], 6).tolist() == [0, 1, 2, 3, 4, 5]
    # fla varlen: a batch of two rows flattened to [1, 12]
    assert cu_seqlens([[0, 4], [2]], 6).tolist() == [0, 4, 6, 8, 12]
    m = document_causal_mask([0, 2], 4)
    assert m.astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    with pytest.raises(HybridlabError, match="ascending"):
        segment_lengths([3, 1], 6)
    with pytest.raises(HybridlabError, match="inside"):
        segment_lengths([6], 6)


def test_stream_to_disk_equals_in_memory_packing(tmp_path):
    from hybridlab.data.streamed_packing import pack_stream_to_disk

    kw = dict(languages=[], english_share=1.0, seq_len=4, total_tokens=4 * 24, val_fraction=0.1, seed=3)
    write_packed(tmp_path / "mem", pack_mixture(_block_corpus(), IdTokenizer(), block_rows=4, **kw))
    # the same documents in the same (shuffled) order, streamed: 80 train tokens = 20 rows, val 4 rows
    order = np.random.default_rng([3, zlib.crc32(b"eng_Latn")]).permutation(40) + 1
    texts = (" ".join([str(d)] * 7) for d in order)
    stats = pack_stream_to_disk(texts, IdTokenizer(), tmp_path / "disk", lang="eng_Latn", seq_len=4, train_tokens=80,
                                val_fraction=0.1, seed=3, block_rows=4)
    assert (stats["train_tokens"], stats["val_tokens"], stats["block_rows"]) == (80, 16, 4)
    for f in ("tokens.npy", "doc_starts.npy", "doc_offsets.npy"):
        assert np.array_equal(np.load(tmp_path / "mem" / f), np.load(tmp_path / "disk" / f)), f
    assert pl.read_parquet(tmp_path / "mem" / "meta.parquet").equals(pl.read_parquet(tmp_path / "disk" / "meta.parquet"))
    assert stats["max_token_id"] == int(np.load(tmp_path / "disk" / "tokens.npy").max())


def test_stream_to_disk_long_documents_and_short_stream(tmp_path):
    from hybridlab.data.streamed_packing import pack_stream_to_disk

    # docs of 9 and 5 tokens (+EOS): stream 1x9 0 2x5 0 3x9 0 ... ; no val; rows of 4, no shuffle effect (1 block)
    texts = ["1 " * 9, "2 " * 5, "3 " * 9]
    stats = pack_stream_to_disk(iter(texts), IdTokenizer(), tmp_path / "a", lang="eng_Latn", seq_len=4,
                                train_tokens=16, val_fraction=0.0, seed=0, block_rows=4)
    assert stats["train_tokens"] == 16
    ds = PackedDataset(tmp_path / "a", "train")
    assert np.load(tmp_path / "a" / "tokens.npy").tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 2, 2],
                                                               [2, 2, 2, 0]]
    assert [ds.doc_starts(i).tolist() for i in range(4)] == [[0], [], [2], []]
    with pytest.raises(HybridlabError, match=r"the eng_Latn stream ended after 24 tokens but 32 are needed"):
        pack_stream_to_disk(iter(texts), IdTokenizer(), tmp_path / "b", lang="eng_Latn", seq_len=4,
                            train_tokens=32, val_fraction=0.0, seed=0, block_rows=1)
    assert not (tmp_path / "b" / "tokens.npy.tmp").exists()


def test_parallel_heldout_rows_hold_whole_sentences_and_never_training_text():
    # parallel sentence i of a language is its base id + 500 + i repeated (3 + i % 4) times
    par = pl.DataFrame([{"sid": i + 1, "lang": lang, "text": " ".join([str(LANG_BASE[lang] + 500 + i)] * (3 + i % 4)),
                         "source": "flores"} for lang in ("eng_Latn", "fra_Latn") for i in range(40)])
    packed = pack_mixture(_corpus({"eng_Latn": 30, "fra_Latn": 30, "tel_Telu": 30}), IdTokenizer(),
                          **{**KW, "val_fraction": 0.0})
    out = with_parallel_heldout(packed, par, IdTokenizer(), languages=["eng_Latn", "fra_Latn"], n_sentences=7)
    train = out.tokens_NS[(out.meta["split"] == "train").to_numpy()]
    val = out.tokens_NS[(out.meta["split"] == "val").to_numpy()]
    np.testing.assert_array_equal(train, packed.tokens_NS)  # the training rows are untouched
    assert np.isin(val[val > 0] % 1000, np.arange(500, 540)).all()  # held-out rows: parallel text only
    assert not np.isin(train % 1000, np.arange(500, 540)).any()  # no parallel sentence in training
    # eng: sentences 0..6 take 3+4+5+6+3+4+5 tokens + 7 EOS = 37 -> 2 rows of 32; with EOS the sentences end
    # at 4, 9, 15, 22, 26, 31, 37, 44, 48, 53, 59, 66: 11 lie whole inside the 64 tokens
    info = out.stats["heldout"]["languages"]["eng_Latn"]
    assert (info["rows"], info["sentences"]) == (2, 11)
    eng_val = val[:2].reshape(-1)
    expected = [t for i in range(12) for t in [LANG_BASE["eng_Latn"] + 500 + i] * (3 + i % 4) + [0]][:64]
    assert eng_val.tolist() == expected
    assert out.meta.filter(pl.col("split") == "val")["lang"].to_list() == ["eng_Latn"] * 2 + ["fra_Latn"] * 2
    with pytest.raises(HybridlabError, match="replace the mixture's val rows"):
        with_parallel_heldout(pack_mixture(_corpus({"eng_Latn": 30, "fra_Latn": 30, "tel_Telu": 30}), IdTokenizer(),
                                           **KW), par, IdTokenizer(), languages=["eng_Latn"], n_sentences=3)
    with pytest.raises(HybridlabError, match="fewer than the 50 held-out sentences"):
        with_parallel_heldout(packed, par, IdTokenizer(), languages=["fra_Latn"], n_sentences=50)


@pytest.mark.parametrize("heldout", [False, True])
def test_spilled_packing_writes_the_same_bytes_and_no_temporaries(tmp_path, heldout):
    """pack_mixture(spill_dir=...) from a lazily read corpus (the mixture job's path: one language in memory,
    rows on disk) writes exactly the files of the in-memory packing, with and without parallel held-out rows."""
    corpus = _corpus({"eng_Latn": 300, "fra_Latn": 300, "tel_Telu": 300})
    corpus.write_parquet(tmp_path / "mono.parquet")
    par = pl.DataFrame([{"sid": i + 1, "lang": lang, "text": " ".join([str(LANG_BASE[lang] + 500 + i)] * (3 + i % 4)),
                         "source": "flores"} for lang in ("eng_Latn", "fra_Latn") for i in range(40)])
    kw = {**KW, "block_rows": 2, **({"val_fraction": 0.0} if heldout else {})}
    mixes = {"memory": pack_mixture(corpus, IdTokenizer(), **kw),
             "spilled": pack_mixture(pl.scan_parquet(tmp_path / "mono.parquet"), IdTokenizer(),
                                     spill_dir=tmp_path / "spilled", **kw)}
    assert isinstance(mixes["spilled"].tokens_NS, np.memmap)
    for name, mix in mixes.items():
        if heldout:
            mix = with_parallel_heldout(mix, par, IdTokenizer(), languages=["eng_Latn", "fra_Latn"], n_sentences=7)
        write_packed(tmp_path / name, mix)
    files = sorted(p.name for p in (tmp_path / "spilled").iterdir())
    assert files == ["doc_offsets.npy", "doc_starts.npy", "meta.parquet", "stats.json", "tokens.npy"]
    for f in files:
        assert (tmp_path / "memory" / f).read_bytes() == (tmp_path / "spilled" / f).read_bytes(), f
