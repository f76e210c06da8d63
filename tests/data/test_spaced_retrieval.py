import numpy as np
import pytest
import torch

from hybridlab.data import spaced_retrieval as sr
from hybridlab.errors import HybridlabError


def _records(digits, gaps):
    return sr.RetrievalRecords(np.asarray(digits, dtype=np.uint8), np.asarray(gaps, dtype=np.int64))


def test_example_layout_matches_hand_written_sequence():
    ex = sr.build_example(np.array([3, 1, 4], dtype=np.uint8), 2)
    D, F, I = sr.DOLLAR_ID, sr.FILL_ID, sr.IGNORE_INDEX
    assert ex["input_ids"].tolist() == [D, 3, 1, 4, F, F, D, 3, 1, 4]
    assert ex["labels"].tolist() == [I, I, I, I, I, I, I, 3, 1, 4]
    # positions whose next token is an answer digit: the second $ and the first two answer digits
    assert ex["answer_pos"].tolist() == [6, 7, 8]
    assert sr.decode(ex["input_ids"]) == "$ 3 1 4 _ _ $ 3 1 4"
    assert sr.VOCAB_SIZE == 13 and sr.PAD_ID == 12


def test_labels_hf_convention_next_token_targets_are_answer_digits():
    ex = sr.build_example(np.array([9, 0, 7, 7, 2], dtype=np.uint8), 11)
    ids, labels, pos = ex["input_ids"], ex["labels"], ex["answer_pos"]
    # model at position p predicts labels[p+1] == the answer digit at p+1
    assert torch.equal(labels[pos + 1], ids[pos + 1])
    assert labels[pos + 1].tolist() == [9, 0, 7, 7, 2]
    assert int((labels != sr.IGNORE_INDEX).sum()) == 5


def test_collate_right_pads_mixed_gaps():
    recs = _records([[1, 2], [5, 6]], [1, 4])
    batch = sr.make_batch(recs, [0, 1])
    assert batch["input_ids"].shape == (2, 10)  # 2*2 + 4 + 2
    assert batch["length"].tolist() == [7, 10]
    assert batch["input_ids"][0, 7:].tolist() == [sr.PAD_ID] * 3
    assert batch["labels"][0, 7:].tolist() == [sr.IGNORE_INDEX] * 3
    assert batch["attention_mask"].sum(1).tolist() == [7, 10]
    assert batch["answer_pos"].tolist() == [[4, 5], [7, 8]]
    assert batch["answer_digits"].tolist() == [[1, 2], [5, 6]]
    loader = torch.utils.data.DataLoader(sr.SpacedRetrievalDataset(recs), batch_size=2, collate_fn=sr.collate)
    assert torch.equal(next(iter(loader))["input_ids"], batch["input_ids"])


def test_generation_is_deterministic_and_splits_differ():
    cfg = sr.SpacedRetrievalConfig(t=5, gaps=(4, 16), gap_weights=(0.5, 0.5), n_train=200, n_val=50, n_test=50, seed=3)
    a, b = sr.generate_split(cfg, "train"), sr.generate_split(cfg, "train")
    assert np.array_equal(a.digits_NK, b.digits_NK) and np.array_equal(a.gaps_N, b.gaps_N)
    test = sr.generate_split(cfg, "test")
    assert not np.array_equal(a.digits_NK[:50], test.digits_NK)
    other_seed = sr.generate_split(sr.SpacedRetrievalConfig(**{**cfg.__dict__, "seed": 4}), "train")
    assert not np.array_equal(a.digits_NK, other_seed.digits_NK)
    # the gap mix is exact, not just in expectation
    assert (a.gaps_N == 4).sum() == 100 and (a.gaps_N == 16).sum() == 100
    assert a.digits_NK.min() >= 0 and a.digits_NK.max() <= 9


def test_exact_gap_counts_largest_remainder():
    assert sr._exact_gap_counts(7, (1.0, 1.0)).tolist() == [4, 3]
    assert sr._exact_gap_counts(10, (0.25, 0.75)).tolist() == [3, 7]  # tie -> first gap
    assert sr._exact_gap_counts(10, (0.2, 0.3, 0.5)).tolist() == [2, 3, 5]


def test_write_read_roundtrip_and_byte_stable(tmp_path):
    cfg = sr.SpacedRetrievalConfig(t=5, gaps=(8, 8192), n_train=64, n_val=0, n_test=0, seed=1)
    recs = sr.generate_split(cfg, "train")
    sr.write_split(tmp_path / "a.parquet", recs, split="train", seed=1)
    sr.write_split(tmp_path / "b.parquet", recs, split="train", seed=1)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    back = sr.read_split(tmp_path / "a.parquet")
    assert np.array_equal(back.digits_NK, recs.digits_NK) and np.array_equal(back.gaps_N, recs.gaps_N)
    # compact: the gap is stored, not expanded (64 examples x 8192 fillers would be > 500 kB as int64)
    assert (tmp_path / "a.parquet").stat().st_size < 5_000


def test_read_split_errors(tmp_path):
    with pytest.raises(HybridlabError, match="no split file"):
        sr.read_split(tmp_path / "missing.parquet")


def test_ab_pairs_differ_only_in_digits():
    recs = sr.generate_split(sr.SpacedRetrievalConfig(t=5, gaps=(3,), gap_weights=(1.0,), n_train=40, n_val=0, n_test=0), "train")
    a, b = sr.make_ab_pairs(recs, seed=0)
    assert np.array_equal(a.gaps_N, b.gaps_N)
    assert (a.digits_NK != b.digits_NK).all()
    ba, bb = sr.make_batch(a, range(4)), sr.make_batch(b, range(4))
    differ = ba["input_ids"] != bb["input_ids"]
    digit_cols = list(range(1, 6)) + list(range(10, 15))
    assert differ[:, digit_cols].all() and not differ[:, [0, 6, 7, 8, 9]].any()


def test_collision_rate_hand_computed():
    ref = _records([[1, 2], [3, 4]], [5, 5])
    other = _records([[1, 2], [3, 4], [9, 9], [1, 2]], [5, 6, 5, 5])
    assert sr.collision_rate(ref, other) == pytest.approx(2 / 4)
    assert sr.collision_rate(ref, other, match_gap=False) == pytest.approx(3 / 4)


def test_loss_and_accuracy_against_perfect_and_naive_model():
    recs = _records([[1, 2, 3], [4, 5, 6]], [2, 5])
    batch = sr.make_batch(recs, [0, 1])
    B, T = batch["input_ids"].shape
    # an oracle: at each position, put a large logit on the next token
    logits = torch.zeros(B, T, sr.VOCAB_SIZE)
    logits[:, :-1].scatter_(2, batch["input_ids"][:, 1:].unsqueeze(-1), 20.0)
    assert sr.retrieval_loss(logits, batch["labels"]).item() < 1e-6
    assert sr.retrieval_accuracy(logits, batch) == {"digit_acc": 1.0, "seq_acc": 1.0}
    uniform = torch.zeros(B, T, sr.VOCAB_SIZE)
    assert sr.retrieval_loss(uniform, batch["labels"]).item() == pytest.approx(np.log(sr.VOCAB_SIZE), rel=1e-6)
    # break one digit of example 0 -> digit acc 5/6, seq acc 1/2
    p = batch["answer_pos"][0, 1]
    logits[0, p] = 0.0
    logits[0, p, 9] = 20.0
    assert sr.retrieval_accuracy(logits, batch) == {"digit_acc": pytest.approx(5 / 6), "seq_acc": 0.5}


def test_config_validation():
    with pytest.raises(HybridlabError, match="gap_weights"):
        sr.SpacedRetrievalConfig(gaps=(1, 2, 3), gap_weights=(1.0,))
    with pytest.raises(HybridlabError, match="t=0"):
        sr.SpacedRetrievalConfig(t=0)
    with pytest.raises(HybridlabError, match="unknown split"):
        sr.generate_split(sr.SpacedRetrievalConfig(), "dev")


def test_sr_arm_specs_names_and_windows_by_hand():
    """The study's arms from experiments.bld_sr (what the rules turn into jobs), each a valid SRArm spec."""
    from hybridlab.train.arms import sr_arm_specs
    from hybridlab.train.spaced_retrieval import SRArm

    exp = {"freeze_until": [0.05, 0.2], "freeze_windows": [[0.2, 0.1]], "long_gap_fractions": [0.5],
           "freeze_scope": "mixer", "optimizer_after_unfreeze": "muon"}
    specs = sr_arm_specs(exp)
    assert list(specs) == ["baseline", "freeze0-0.05", "freeze0-0.2", "window0.2+0.1", "longgap0.5"]
    assert specs["freeze0-0.05"]["windows"] == [[0, 0.05]]
    assert specs["window0.2+0.1"]["windows"] == [[0.2, 0.3]]  # 0.2 + 0.1 rounded, not 0.30000000000000004
    assert specs["longgap0.5"] == {"name": "longgap0.5", "scope": "mixer", "optimizer_after_unfreeze": "muon",
                                   "windows": [], "long_gap_fraction": 0.5}
    arms = [SRArm.from_dict(s) for s in specs.values()]
    assert [a.name for a in arms] == list(specs) and arms[-1].long_gap_fraction == 0.5


def test_sr_update_arms_and_their_score_points_by_hand():
    """Freeze arms in updates, their windows read back from the names, and the score checkpoints every arm
    saves (the configured ones plus the end of each freeze window, in its own unit)."""
    from hybridlab.train.arms import sr_arm_specs, sr_arm_windows, sr_score_points
    from hybridlab.train.spaced_retrieval import SRArm

    exp = {"freeze_until": [0.1], "freeze_windows": [[0.2, 0.1]], "freeze_until_updates": [12],
           "freeze_windows_updates": [[5, 20], [60, 24]], "long_gap_fractions": [], "freeze_scope": "block",
           "optimizer_after_unfreeze": None, "score_fractions": [0.5, 1.0], "score_updates": [10, 20]}
    specs = sr_arm_specs(exp)
    assert list(specs) == ["baseline", "freeze0-0.1", "window0.2+0.1", "freeze0-12u", "window5u+20u",
                           "window60u+24u"]
    assert specs["window5u+20u"]["update_windows"] == [[5, 25]] and specs["window5u+20u"]["windows"] == []
    assert SRArm.from_dict(specs["window60u+24u"]).freeze.update_windows == ((60, 84),)
    assert sr_score_points(exp) == ([0.1, 0.3, 0.5, 1.0], [10, 12, 20, 25, 84])
    # 240 updates: fractions rounded half up (0.3 * 240 = 72), updates as written; no window for the baseline
    assert [sr_arm_windows(a, 240) for a in specs] == [None, [(0, 24)], [(48, 72)], [(0, 12)], [(5, 25)],
                                                       [(60, 84)]]
    assert sr_arm_windows("longgap0.5", 240) is None
