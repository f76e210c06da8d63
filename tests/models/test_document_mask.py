"""Document masking (data.packing.document_mask): nothing crosses a packed document boundary.

The reference everywhere is the document run on its own: the varlen ops against the fp64 naive
recurrences per sequence, the mixers and whole hybrids (Qwen3- and Granite-style teachers, SmolLM3
NoPE for BLD-NL) against each document alone, and the training loss against per-document losses.
Each check also shows that the unmasked forward differs, so it can fail.
"""

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from transformers import GraniteConfig, GraniteForCausalLM, Qwen3Config, Qwen3ForCausalLM

from hybridlab.data.packing import (
    Documents,
    PackedDataset,
    in_document_targets,
    pack_mixture,
    position_ids,
    write_packed,
)
from hybridlab.errors import HybridlabError
from hybridlab.models import ops
from hybridlab.models.convert import convert_to_hybrid, packed_documents
from hybridlab.models.mixers import MixerConfig, build_mixer
from hybridlab.train.tasks import CausalLMTask, next_token_labels

CU = [0, 5, 20, 37]  # three sequences of 5, 15 and 17 tokens in one [1, 37] row


def _op_inputs(kind, T=37, H=2, K=8, V=6, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def u(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    q, k, v = r(1, T, H, K), r(1, T, H, K), r(1, T, H, V)
    if kind == "gdn":
        return q, k, v, -u(1, T, H), u(1, T, H)
    gk = -u(1, T, H, K)
    return (q, k, v, gk, u(1, T, H)) if kind == "kda" else (q, k, v, gk)


OPS = {
    "gdn": (ops.chunk_gated_delta_rule, ops.naive_recurrent_gdn, {"use_qk_l2norm_in_kernel": True}),
    "kda": (ops.chunk_kda, ops.naive_recurrent_kda, {"use_qk_l2norm_in_kernel": True}),
    "gla": (ops.chunk_gla, ops.naive_recurrent_gla, {}),
}


@pytest.mark.parametrize("kind", sorted(OPS))
def test_varlen_ops_equal_the_naive_recurrence_per_sequence(kind):
    chunk, naive, kw = OPS[kind]
    args = [x.requires_grad_() for x in _op_inputs(kind)]
    h0 = torch.randn(3, 2, 8, 6, dtype=torch.float64, requires_grad=True)
    o, hT = chunk(*args, initial_state=h0, output_final_state=True, cu_seqlens=torch.tensor(CU), chunk_size=4, **kw)
    assert o.shape == (1, 37, 2, 6) and hT.shape == (3, 2, 8, 6)
    grads = torch.autograd.grad((o.square().sum() + hT.sum()), args + [h0])
    ref_o, ref_h = [], []
    for i in range(3):
        a, b = CU[i], CU[i + 1]
        oi, hi = naive(*(x[:, a:b] for x in args), initial_state=h0[i:i + 1], output_final_state=True, **kw)
        ref_o.append(oi)
        ref_h.append(hi)
    ref_o, ref_h = torch.cat(ref_o, 1), torch.cat(ref_h, 0)
    torch.testing.assert_close(o, ref_o, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(hT, ref_h, rtol=1e-9, atol=1e-10)
    ref_grads = torch.autograd.grad((ref_o.square().sum() + ref_h.sum()), args + [h0])
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-9)
    # one unsplit sequence is a different computation: the test can tell them apart
    whole, _ = chunk(*args, initial_state=h0[:1], chunk_size=4, **kw)
    assert (whole[:, 5:] - o[:, 5:]).abs().max() > 1e-3


def test_varlen_bad_cu_seqlens_are_one_line_errors():
    q, k, v, g, beta = _op_inputs("gdn")
    with pytest.raises(HybridlabError, match="rise strictly from 0 to T=37"):
        ops.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 5, 30]))
    with pytest.raises(HybridlabError, match="batch size must be 1"):
        two = [torch.cat([x, x]) for x in (q, k, v, g, beta)]
        ops.chunk_gated_delta_rule(*two, cu_seqlens=torch.tensor([0, 37]))
    with pytest.raises(HybridlabError, match="one state per sequence"):
        ops.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor(CU),
                                   initial_state=torch.zeros(2, 2, 8, 6, dtype=torch.float64))


DOCS_BT = torch.tensor([[0] * 5 + [1] * 6 + [2] * 2, [0] * 1 + [1] * 12])  # doc ids per position, 2 rows x 13


@pytest.mark.parametrize("kind", ["gdn", "kda", "gla"])
def test_mixer_documents_equal_each_document_alone(kind):
    torch.manual_seed(0)
    mixer = build_mixer(MixerConfig(kind=kind, hidden_size=16, num_heads=2, head_k_dim=8, head_v_dim=8,
                                    chunk_size=4), 0).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    y, _ = mixer(x, document_ids_BT=DOCS_BT)
    for b in range(2):
        for d in DOCS_BT[b].unique():
            idx = (DOCS_BT[b] == d).nonzero().reshape(-1)
            alone, _ = mixer(x[b:b + 1, idx])
            torch.testing.assert_close(y[b:b + 1, idx], alone, rtol=1e-10, atol=1e-12)
    unmasked, _ = mixer(x)
    assert (unmasked[0, 5:] - y[0, 5:]).abs().max() > 1e-4  # the conv and the state did leak before
    with pytest.raises(HybridlabError, match="use_cache"):
        mixer(x, document_ids_BT=DOCS_BT, use_cache=True)


def test_packed_documents_follow_transformers_rule():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    assert packed_documents(pos, 2).tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 0]]
    assert packed_documents(torch.arange(6)[None], 3) is None  # one sequence per row
    assert packed_documents(None, 2) is None


V = 97


def _teacher(arch):
    torch.manual_seed(1)
    common = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, use_cache=False, pad_token_id=None, bos_token_id=None,
                  eos_token_id=None)
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**common, tie_word_embeddings=True)).double().eval()
    cfg = GraniteConfig(**common, attention_multiplier=1 / 8, residual_multiplier=0.5, embedding_multiplier=2.0,
                        logits_scaling=4.0)
    return GraniteForCausalLM(cfg).double().eval()


def _packed_row(starts, T, seed=0):
    ids = torch.randint(1, V, (1, T), generator=torch.Generator().manual_seed(seed))
    return ids, torch.from_numpy(position_ids(starts, T))[None]


@pytest.mark.parametrize("arch", ["qwen3", "granite"])
@pytest.mark.parametrize("kind", ["dense", "gdn", "kda"])
def test_model_logits_per_document_equal_each_document_alone(arch, kind):
    model = _teacher(arch)
    if kind != "dense":
        model = convert_to_hybrid(model, fa_layers=[1], mixer_kind=kind, seed=3).double().eval()
    starts = [0, 7, 19]
    ids, pos = _packed_row(starts, 26)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos).logits
        plain = model(input_ids=ids).logits
        for a, b in zip(starts, starts[1:] + [26]):
            alone = model(input_ids=ids[:, a:b]).logits
            torch.testing.assert_close(packed[:, a:b], alone, rtol=1e-9, atol=1e-10)
    assert (plain[:, 7:] - packed[:, 7:]).abs().max() > 1e-4


def test_bld_nl_nope_hybrid_per_document_equals_each_document_alone():
    from hybridlab.train.bld_nl import build_nope_hybrid

    shape = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
             "head_dim": 16, "intermediate_size": 64, "mixer_chunk_size": 4}
    model = build_nope_hybrid(shape, pattern=["full_attention", "mixer", "mixer", "mixer"], mixer="kda",
                              vocab_size=V, context_len=32, eos_id=0, seed=0).double().eval()
    starts = [0, 9, 20]
    ids, pos = _packed_row(starts, 32)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        plain = model(input_ids=ids, use_cache=False).logits
        for a, b in zip(starts, starts[1:] + [32]):
            alone = model(input_ids=ids[:, a:b], use_cache=False).logits
            torch.testing.assert_close(packed[:, a:b], alone, rtol=1e-9, atol=1e-10)
    assert (plain[:, 9:] - packed[:, 9:]).abs().max() > 1e-4


def test_hybrid_refuses_packed_positions_with_a_cache():
    model = convert_to_hybrid(_teacher("qwen3"), fa_layers=[1], mixer_kind="gdn", seed=3).double().eval()
    ids, pos = _packed_row([0, 7], 12)
    with pytest.raises(HybridlabError, match="use_cache=False"):
        model(input_ids=ids, position_ids=pos, use_cache=True)


def test_stage1_direct_mixer_call_uses_position_ids():
    """Stage 1 calls the mixers outside their decoder layer: position_ids still cut the documents."""
    from hybridlab.train.distill import mixer_wrappers

    student = convert_to_hybrid(_teacher("qwen3"), fa_layers=[1], mixer_kind="gdn", seed=3).double().eval()
    wrapper = mixer_wrappers(student)[0]
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    pos = torch.from_numpy(position_ids([0, 5], 12))[None]
    with torch.no_grad():
        y = wrapper(x, position_ids=pos)[0]
        torch.testing.assert_close(y[:, 5:], wrapper(x[:, 5:])[0], rtol=1e-10, atol=1e-12)


def test_causal_lm_loss_is_the_token_mean_of_per_document_losses():
    model = _teacher("qwen3")
    starts = [0, 7, 19]
    ids, pos = _packed_row(starts, 26)
    batch = Documents(ids, pos)
    labels = next_token_labels(batch)
    assert (labels[0, [6, 18, 25]] == -100).all() and (labels[0, :6] == ids[0, 1:7]).all()
    assert in_document_targets(batch).sum() == 26 - 3
    task = CausalLMTask()
    loss, _ = task.loss(model, batch)
    assert task.num_tokens(batch) == 23
    total, n = 0.0, 0
    with torch.no_grad():
        for a, b in zip(starts, starts[1:] + [26]):
            logits = model(input_ids=ids[:, a:b]).logits[0, :-1]
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, a + 1:b], reduction="sum"))
            n += b - a - 1
    assert abs(float(loss.detach()) - total / n) < 1e-9
    unmasked, _ = task.loss(model, ids)
    assert abs(float(unmasked.detach()) - total / n) > 1e-4


class _IdTok:
    """The text "7 7 7" tokenises to [7, 7, 7]; EOS is 0."""

    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[int(x) for x in t.split()] for t in texts]}


def test_packed_dataset_yields_documents_and_joined_rows_keep_continuations(tmp_path):
    import polars as pl

    from hybridlab.train.bld_nl import JoinedRows

    rng = np.random.default_rng(0)
    df = pl.DataFrame([{"doc_id": f"d{k}", "lang": "eng_Latn", "text": " ".join([str(k + 1)] * int(rng.integers(3, 30))),
                        "source": "test"} for k in range(60)])
    mix = pack_mixture(df, _IdTok(), languages=[], english_share=1.0, seq_len=16, total_tokens=16 * 20,
                       val_fraction=0.1, seed=0, block_rows=2)
    write_packed(tmp_path, mix)
    plain = PackedDataset(tmp_path, "train")
    docs = PackedDataset(tmp_path, "train", documents=True)
    for i in range(len(docs)):
        item = docs[i]
        assert isinstance(item, Documents) and torch.equal(item.input_ids, plain[i])
        starts = docs.doc_starts(i)
        assert torch.equal(item.position_ids, torch.from_numpy(position_ids(starts, 16)))
    batch = default_collate([docs[0], docs[1]])
    assert isinstance(batch, Documents) and batch.input_ids.shape == (2, 16)
    joined = JoinedRows(docs, 2)[0]
    want = np.concatenate([docs.doc_starts(0), docs.doc_starts(1) + 16])
    assert torch.equal(joined.position_ids, torch.from_numpy(position_ids(want, 32)))
    if 0 not in docs.doc_starts(1):  # row 1 continues row 0's document: no restart at position 16
        assert int(joined.position_ids[16]) > 0
