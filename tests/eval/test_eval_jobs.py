"""The eval rules' library jobs (softcka_table, niah_tables, recency_table, perplexity_tables,
position_loss_tables, retrieval_heads_tables, retrieval_score_table) on tiny local models, without Snakemake.

One module fixture builds a byte-level BPE on a small bilingual corpus, a 2-layer Qwen3 teacher and its
converted GDN student (FA at layer 1), the packed mixtures and the BLD-NL style arms they read.
"""

import json
import math
import shutil

import polars as pl
import pytest
import torch
from tiny_models import tiny_qwen3
from transformers import Qwen3ForCausalLM

from hybridlab.errors import HybridlabError

ENG, FRA = "eng_Latn", "fra_Latn"
WORDS = ("the cat sat on a mat and the dog ran to the red house while birds sang over green hills near "
         "a quiet river where old men fish every morning before the sun rises high").split()


def _sentence(rng, n=12):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _silent(_msg):
    pass


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import random

    from hybridlab.data.packing import pack_mixture, write_packed
    from hybridlab.data.tokenizer import train_bpe
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.io import save_hybrid

    root = tmp_path_factory.mktemp("eval_jobs")
    rng = random.Random(0)
    eng = [_sentence(rng) for _ in range(12)]
    fra = [" ".join(reversed(s.split())) for s in eng]  # a "translation": same words, another order
    parallel = pl.DataFrame({"sid": list(range(12)) * 2, "lang": [ENG] * 12 + [FRA] * 12, "text": eng + fra,
                             "source": ["toy"] * 24})
    docs = {lang: [" ".join(_sentence(rng) for _ in range(8)) for _ in range(6)] for lang in (ENG, FRA)}
    mono = pl.DataFrame({"doc_id": [f"{lang}-{i}" for lang, ds in docs.items() for i in range(len(ds))],
                         "lang": [lang for lang, ds in docs.items() for _ in ds],
                         "text": [d for ds in docs.values() for d in ds], "source": ["toy"] * 12})
    tok_dir = root / "tok"
    tok = train_bpe(eng + fra + mono["text"].to_list(), vocab_size=300, min_frequency=2, out_path=tok_dir)

    teacher = tiny_qwen3(seed=0, vocab_size=len(tok), max_position_embeddings=1024,
                         eos_token_id=tok.convert_tokens_to_ids("<|endoftext|>")).eval()
    teacher_dir = root / "teacher"
    teacher.save_pretrained(teacher_dir)
    student = convert_to_hybrid(teacher, [1], "gdn", seed=0)
    student_dir = save_hybrid(student, root / "student")

    mixtures = {}
    for name, langs, share in (("multi", [FRA], 0.5), ("english", [], 1.0)):
        mixtures[name] = root / f"mixture_{name}"
        write_packed(mixtures[name], pack_mixture(mono, tok, languages=langs, english_share=share, seq_len=32,
                                                  total_tokens=4000, val_fraction=0.3, seed=0))

    arms = []  # BLD-NL-style arms: converted hybrids with size / variant in hybrid.json
    for variant, fa in (("baseline", [0]), ("bld", [1])):
        arm = convert_to_hybrid(teacher, fa, "gdn", seed=1)
        arm.hybridlab_spec.extra = {"size": "xs", "variant": variant}
        arms.append(save_hybrid(arm, root / "arms" / f"gdn-{variant}"))
    models = {"distilled": [{"teacher": "toy/teacher", "teacher_path": str(teacher_dir), "student": "sandwich-gdn",
                             "student_path": str(student_dir), "tokenizer": str(tok_dir)}]}
    return dict(root=root, parallel=parallel, mono=mono, tok=tok, tok_dir=tok_dir, teacher_dir=teacher_dir,
                student_dir=student_dir, mixtures=mixtures, arms=arms, models=models)


def _analysis_params(tiny, section, cfg):
    return {"models": tiny["models"], "dtype": "float32", "seed": 3, "english": ENG, section: cfg}


# ------------------------------------------------------------------------------------------------ SoftCKA

SOFTCKA_COLUMNS = ["model", "pair", "role", "kind", "layer", "layer_type", "lang", "cka", "cka_lo", "cka_hi",
                   "cka_debiased", "alignment", "alignment_lo", "alignment_hi", "alignment_method",
                   "alignment_gram_rows", "alignment_pooled", "language_offset", "language_offset_lo",
                   "language_offset_hi", "mmd", "n_sentences", "method", "sigma_eng", "sigma_x", "sigma_pair",
                   "sigma_convention"]


def test_layer_groups_cover_every_hidden_state_once():
    from hybridlab.eval.softcka import layer_groups

    assert layer_groups(3, 2) == [[0, 1], [2, 3]]
    assert layer_groups(3, 0) == [[0, 1, 2, 3]]
    assert layer_groups(4, 2) == [[0, 1], [2, 3], [4]]


def test_softcka_table_rows_labels_and_passes(tiny):
    from hybridlab.eval.softcka import softcka_table

    cfg = {"n_sentences": 8, "kinds": ["hidden", "attn_delta"], "method": "exact", "block_tokens": 256,
           "rff_features": 64, "batch_size": 4, "layers_per_pass": 1, "n_boot": 0}
    table = softcka_table(tiny["parallel"], _analysis_params(tiny, "softcka", cfg), device="cpu", log=_silent)
    assert table.columns == SOFTCKA_COLUMNS
    # 2 models (student, teacher) x 1 pair x 1 language x (3 hidden states + 2 attn_delta layers)
    assert table.height == 2 * (3 + 2)
    assert table["model"].unique().sort().to_list() == ["toy/teacher", "toy/teacher/sandwich-gdn"]
    assert set(table["pair"]) == {"toy/teacher/sandwich-gdn"} and set(table["lang"]) == {FRA}
    assert table.select("model", "pair", "kind", "layer", "lang").equals(
        table.select("model", "pair", "kind", "layer", "lang").sort("model", "pair", "kind", "layer", "lang"))
    student = table.filter(pl.col("model") == "toy/teacher/sandwich-gdn")
    types = dict(zip(zip(student["kind"], student["layer"]), student["layer_type"]))
    assert types == {("hidden", 0): "embedding", ("hidden", 1): "gdn", ("hidden", 2): "full_attention",
                     ("attn_delta", 0): "gdn", ("attn_delta", 1): "full_attention"}
    assert (table["n_sentences"] == 8).all() and table["cka_lo"].is_nan().all()  # n_boot 0: no interval
    # the student inherits the teacher's embeddings: identical layer-0 representations, identical values
    emb = table.filter((pl.col("kind") == "hidden") & (pl.col("layer") == 0))
    assert emb["cka"][0] == pytest.approx(emb["cka"][1], abs=1e-12)
    assert ((table["cka"] > 0) & (table["cka"] <= 1 + 1e-9)).all()
    # how hidden states are grouped into capture passes does not change a value
    one_pass = softcka_table(tiny["parallel"], _analysis_params(tiny, "softcka", {**cfg, "layers_per_pass": 0}),
                             device="cpu", log=_silent)
    assert one_pass.equals(table)


def test_softcka_per_model_jobs_gathered_equal_one_job_over_every_model(tiny, tmp_path):
    """eval_softcka_model runs one model per job; gather_softcka gives the table one job over all writes."""
    from hybridlab.eval.softcka import gather_softcka, softcka_table

    cfg = {"n_sentences": 6, "kinds": ["hidden", "attn_delta"], "method": "exact", "block_tokens": 256,
           "rff_features": 64, "batch_size": 4, "layers_per_pass": 0, "n_boot": 0}
    params = _analysis_params(tiny, "softcka", cfg)
    whole = softcka_table(tiny["parallel"], params, device="cpu", log=_silent)
    paths = []
    for name in ("toy/teacher/sandwich-gdn", "toy/teacher"):  # the jobs run in any order
        one = softcka_table(tiny["parallel"], params, device="cpu", only=name, log=_silent)
        assert set(one["model"]) == {name}
        paths.append(tmp_path / f"{name.replace('/', '--')}.parquet")
        one.write_parquet(paths[-1])
    assert gather_softcka(paths).equals(whole)
    # a further seed reuses its teacher's first-seed table, which holds rows for pairs this seed lacks
    teacher = pl.read_parquet(paths[1])
    pl.concat([teacher, teacher.with_columns(pair=pl.lit("toy/teacher/other-gdn"))]).write_parquet(paths[1])
    assert gather_softcka(paths, pairs=["toy/teacher/sandwich-gdn"]).equals(whole)
    with pytest.raises(HybridlabError, match="no rows for pair"):
        gather_softcka(paths, pairs=["toy/teacher/gone-gdn"])
    with pytest.raises(HybridlabError, match="no analysis model named 'toy/nope'"):
        softcka_table(tiny["parallel"], params, device="cpu", only="toy/nope", log=_silent)
    pl.DataFrame({"x": [1]}).write_parquet(tmp_path / "bad.parquet")
    with pytest.raises(HybridlabError, match="bad.parquet has other columns"):
        gather_softcka([paths[0], tmp_path / "bad.parquet"])
    (tmp_path / "torn.parquet").write_bytes(b"PAR1 torn")
    with pytest.raises(HybridlabError, match="torn.parquet is damaged"):
        gather_softcka([tmp_path / "torn.parquet"])


# --------------------------------------------------------------------------------------------------- NIAH

class _WordTokenizer:
    """One token per whitespace word (what answer_budgets counts)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}


def test_answer_budgets_are_the_longest_answer_per_task_plus_slack():
    from hybridlab.eval.niah import NiahExample, answer_budgets

    def ex(task, answers):
        return NiahExample(task=task, lang=ENG, target_tokens=64, prompt="p", answers=tuple(answers),
                           depth=0.5, context_tokens=60, none_word="none")

    exs = [ex("niah_single", ["1234"]), ex("niah_multivalue", ["1", "2", "3"]), ex("niah_none", []),
           ex("niah_single", ["5678"])]
    budgets = answer_budgets(_WordTokenizer(), exs, slack=2)
    assert [(b[0][0].task, len(b[0]), b[1]) for b in budgets] == [
        ("niah_single", 2, 1 + 2),  # one value
        ("niah_multivalue", 1, 3 + 2),  # "1, 2, 3": three words with the template's ", " joiner
        ("niah_none", 1, 1 + 2)]  # the none word


def test_niah_tables_one_row_per_example_and_cell(tiny):
    from hybridlab.eval.niah import niah_tables

    cfg = {"languages": [ENG, FRA], "tasks": ["niah_single", "niah_none"], "context_tokens": [480],
           "examples_per_cell": 2, "answer_slack_tokens": 2}
    examples, summary = niah_tables(tiny["mono"], _analysis_params(tiny, "niah", cfg), device="cpu", log=_silent)
    # 2 models x 2 languages x 2 tasks x 1 length x 2 examples
    assert examples.height == 16 and summary.height == 8
    assert examples.columns[:6] == ["model", "pair", "role", "prompts", "chat_template", "yarn_factor"]
    assert summary.columns == ["model", "pair", "role", "lang", "task", "context_tokens", "n", "accuracy", "score",
                               "mean_prompt_tokens", "seconds", "peak_memory_bytes", "memory_kind", "oom",
                               "n_oom", "oom_rate", "native_window", "prompts", "chat_template", "yarn_factor",
                               "memory_cap_gib"]
    assert (summary["n"] == 2).all() and (summary["context_tokens"] == 480).all()
    assert set(summary["prompts"]) == {"project"} and not summary["chat_template"].any()
    assert summary["yarn_factor"].is_null().all()
    assert (summary["mean_prompt_tokens"] <= 480).all()
    # accuracy is the mean of the examples' correct flags per cell
    cell = examples.filter((pl.col("model") == "toy/teacher") & (pl.col("lang") == FRA)
                           & (pl.col("task") == "niah_none"))
    got = summary.filter((pl.col("model") == "toy/teacher") & (pl.col("lang") == FRA)
                         & (pl.col("task") == "niah_none"))["accuracy"][0]
    assert got == pytest.approx(cell["correct"].mean())
    # models sharing a tokenizer share their examples
    a, b = (examples.filter(pl.col("model") == m).select("lang", "task", "depth", "context_tokens")
            for m in ("toy/teacher", "toy/teacher/sandwich-gdn"))
    assert a.equals(b)


# ------------------------------------------------------------------------------------------------ recency

def test_recency_table_rows_per_fa_head_and_window(tiny):
    from hybridlab.eval.recency import RECENCY_COLUMNS, recency_table

    cfg = {"languages": [ENG, FRA], "n_sequences": 2, "input_tokens": 24, "windows": [4, 8], "batch_size": 2}
    table = recency_table(tiny["mono"], _analysis_params(tiny, "recency", cfg), device="cpu", log=_silent)
    assert table.columns == RECENCY_COLUMNS
    # teacher: 2 FA layers, student: 1 (layer 1); 2 heads, 2 windows, 2 languages
    assert table.filter(pl.col("model") == "toy/teacher").height == 2 * 2 * 2 * 2
    student = table.filter(pl.col("model") == "toy/teacher/sandwich-gdn")
    assert student.height == 1 * 2 * 2 * 2 and set(student["layer"]) == {1}
    assert (table["n_sequences"] == 2).all() and (table["input_tokens"] == 24).all()
    # the window changes the mass, not the mean distance of a head; more keys hold more mass
    per_head = table.group_by("model", "lang", "layer", "head").agg(pl.col("mean_distance").n_unique().alias("k"),
                                                                    pl.col("mass").sort_by("window").alias("m"))
    assert (per_head["k"] == 1).all()
    assert all(m[0] <= m[1] + 1e-12 for m in per_head["m"].to_list())


def test_recency_table_needs_a_full_attention_layer(tiny, tmp_path):
    from hybridlab.eval.recency import recency_table
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.io import save_hybrid
    from hybridlab.models.registry import load_causal_lm

    no_fa = save_hybrid(convert_to_hybrid(load_causal_lm(str(tiny["teacher_dir"])), [], "gdn", seed=0),
                        tmp_path / "no_fa")
    models = {"distilled": [{**tiny["models"]["distilled"][0], "student_path": str(no_fa)}]}
    params = {**_analysis_params(tiny, "recency", {"languages": [ENG], "n_sequences": 1, "input_tokens": 8,
                                                   "windows": [2], "batch_size": 1}), "models": models}
    with pytest.raises(HybridlabError, match="no full-attention layer"):
        recency_table(tiny["mono"], params, device="cpu", log=_silent)


# ------------------------------------------------------------------------------------------------ perplexity

def _metrics(tokens, ce, kl):
    return pl.DataFrame({"step": list(range(len(tokens))), "tokens": tokens, "eval/ce": ce, "eval/kl": kl,
                         f"eval/ce/{ENG}": ce, f"eval/kl/{ENG}": kl})


def test_perplexity_tables_teacher_as_its_own_student_has_zero_kl(tiny, tmp_path):
    from hybridlab.eval.perplexity import PERPLEXITY_COLUMNS, ROWS_COLUMNS, TOKENS_COLUMNS, perplexity_tables

    # "students": the teacher itself (a copy) as the baseline placement, the converted student as sandwich
    same = tmp_path / "same"
    shutil.copytree(tiny["teacher_dir"], same)
    other = tmp_path / "other"
    shutil.copytree(tiny["student_dir"], other)
    _metrics([100, 200, 300], [3.0, 2.0, 1.0], [1.0, 0.5, 0.2]).write_parquet(same / "metrics.parquet")
    _metrics([100, 200, 300], [3.0, 1.0, 0.5], [1.0, 0.2, 0.1]).write_parquet(other / "metrics.parquet")
    params = {"teachers": {"toy": str(tiny["teacher_dir"])}, "rows_per_language": 2, "batch_size": 2,
              "baseline_placement": "standard_periodic",
              "students": [{"teacher": "toy", "placement": "standard_periodic", "mixer": "gdn", "dir": str(same), "seed": 0},
                           {"teacher": "toy", "placement": "sandwich", "mixer": "gdn", "dir": str(other), "seed": 0}]}
    ppl, tokens, rows = perplexity_tables(str(tiny["mixtures"]["multi"]), params, device="cpu", log=_silent)
    assert ppl.columns == PERPLEXITY_COLUMNS and tokens.columns == TOKENS_COLUMNS and rows.columns == ROWS_COLUMNS
    # 3 models x (2 languages + "all")
    assert ppl.height == 9 and ppl["model"].unique(maintain_order=True).to_list() == [
        "toy", "toy/standard_periodic-gdn", "toy/sandwich-gdn"]
    teacher = ppl.filter(pl.col("model") == "toy")
    assert teacher["kl"].is_null().all() and teacher["placement"].is_null().all() and teacher["seed"].is_null().all()
    copy = ppl.filter(pl.col("model") == "toy/standard_periodic-gdn")
    assert copy["ce"].to_list() == pytest.approx(teacher["ce"].to_list(), rel=1e-6)
    assert copy["kl"].to_list() == pytest.approx([0.0] * 3, abs=1e-6)
    overall = teacher.filter(pl.col("lang") == "all")
    assert overall["n_tokens"][0] == teacher.filter(pl.col("lang") != "all")["n_tokens"].sum()
    assert overall["ppl"][0] == pytest.approx(math.exp(overall["ce"][0]))
    # per row: 2 rows per language for each of 3 models, paired on `row`
    assert rows.height == 3 * 2 * 2 and rows.group_by("model").len()["len"].to_list() == [4, 4, 4]
    assert rows.filter(pl.col("model") == "toy")["kl"].is_null().all()
    # tokens to baseline, hand-checked: the baseline's final ce 1.0 (reached at 300 tokens) is reached by
    # sandwich at its logged point (200, 1.0): fraction 200 / 300
    hit = tokens.filter((pl.col("metric") == "ce") & (pl.col("lang") == "all") & (pl.col("placement") == "sandwich"))
    assert hit["target"][0] == 1.0 and hit["tokens"][0] == pytest.approx(200.0)
    assert hit["fraction"][0] == pytest.approx(200 / 300)
    assert set(tokens["lang"]) == {"all", ENG} and (tokens["seed"] == 0).all()


def test_perplexity_tables_without_teachers_is_an_error(tiny):
    from hybridlab.eval.perplexity import perplexity_tables

    with pytest.raises(HybridlabError, match="--params teachers is empty"):
        perplexity_tables(str(tiny["mixtures"]["multi"]), {"teachers": {}, "students": [], "rows_per_language": 1,
                                                           "batch_size": 1, "baseline_placement": "sandwich"}, log=_silent)


# ------------------------------------------------------------------------------------------- position loss

def _position_params(evaluator, **over):
    return {"seed": 0, "position_loss": {"documents": "mixture_val", "n_docs": 3, "doc_len": 24,
                                         "evaluator": evaluator, "short_window": 4, "short_stride": 2,
                                         "threshold": 0.0, "scheme": "log2", "batch_size": 2, **over}}


def test_position_loss_tables_share_the_evaluators_key_tokens(tiny):
    from hybridlab.eval.position_loss import BUCKET_COLUMNS, SUMMARY_SCHEMA, position_loss_tables

    arms = tiny["arms"]
    buckets, summary = position_loss_tables(arms, _position_params("gdn-bld"), mixture=tiny["mixtures"]["english"],
                                            log=_silent)
    assert buckets.columns == BUCKET_COLUMNS and summary.schema == pl.Schema(SUMMARY_SCHEMA)
    assert summary["model"].to_list() == ["gdn-baseline", "gdn-bld"]
    assert summary["variant"].to_list() == ["baseline", "bld"] and set(summary["size"]) == {"xs"}
    assert set(summary["mixer"]) == {"gdn"} and set(summary["evaluator"]) == {"gdn-bld"}
    assert (summary["n_docs"] == 3).all() and (summary["doc_len"] == 24).all()
    assert (summary["n_tokens"] == 3 * 23).all()  # every target of every window
    assert summary["n_key_tokens"].n_unique() == 1  # the evaluator's, for every arm
    # log2 buckets of 23 targets: [1,2) [2,4) [4,8) [8,16) [16,24)
    first = buckets.filter(pl.col("model") == "gdn-baseline")
    assert first["bucket_lo"].to_list() == [1, 2, 4, 8, 16] and first["n_tokens"].sum() == 3 * 23
    # ppl is exp of the token-mean loss, which the buckets pool
    mean = float((first["mean_loss"] * first["n_tokens"]).sum() / first["n_tokens"].sum())
    assert summary["ppl"][0] == pytest.approx(math.exp(mean), rel=1e-6)
    assert (summary["ppl_lo"] <= summary["ppl"]).all() and (summary["ppl"] <= summary["ppl_hi"]).all()


def test_position_loss_tables_evaluator_must_be_an_arm(tiny):
    from hybridlab.eval.position_loss import position_loss_tables

    with pytest.raises(HybridlabError, match="is not one of the arms"):
        position_loss_tables(tiny["arms"], _position_params("nope"), mixture=tiny["mixtures"]["english"], log=_silent)


def test_position_loss_tables_with_an_external_evaluator(tiny, tmp_path):
    """The key tokens come from the external model (the teacher, same tokenizer), not from an arm."""
    from hybridlab.eval.position_loss import document_windows, key_tokens, position_loss_documents, position_loss_tables

    params = _position_params("toy/teacher")
    _, summary = position_loss_tables(tiny["arms"], params, mixture=tiny["mixtures"]["english"],
                                      evaluator_model=str(tiny["teacher_dir"]), log=_silent)
    c = params["position_loss"]
    windows, _ = document_windows(position_loss_documents(c, mixture=tiny["mixtures"]["english"]), c["doc_len"],
                                  c["n_docs"])
    opts = dict(short_window=4, short_stride=2, threshold=0.0, batch_size=2)
    teacher = Qwen3ForCausalLM.from_pretrained(tiny["teacher_dir"]).eval()
    keys = key_tokens(teacher, windows, **opts)
    assert set(summary["evaluator"]) == {"toy/teacher"}
    assert summary["n_key_tokens"].to_list() == [keys.n_key_tokens] * 2 and keys.n_key_tokens > 0
    from hybridlab.models.registry import load_causal_lm

    for arm, lp in zip(tiny["arms"], summary["long_ppl"].to_list()):
        with torch.no_grad():
            logits = load_causal_lm(arm, dtype="float32", device_map="cpu")(input_ids=windows).logits
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).double(), windows[:, 1:].flatten(),
                                                reduction="none").view(windows.shape[0], -1)
        assert lp == pytest.approx(math.exp(float(nll[keys.mask].mean())), rel=1e-4)
    # an arm as evaluator finds other key tokens on the same windows
    arm_keys = key_tokens(load_causal_lm(tiny["arms"][1], dtype="float32", device_map="cpu"), windows, **opts)
    assert not torch.equal(arm_keys.mask, keys.mask)
    # an evaluator that cannot embed the windows' token ids (another tokenizer) is one line
    small = tiny_qwen3(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1)
    small.save_pretrained(tmp_path / "small")
    with pytest.raises(HybridlabError, match="has 8 token embeddings"):
        position_loss_tables(tiny["arms"], params, mixture=tiny["mixtures"]["english"],
                             evaluator_model=str(tmp_path / "small"), log=_silent)


def test_arm_columns_read_hybrid_json(tiny):
    from hybridlab.eval.pairs import arm_columns

    assert arm_columns(tiny["arms"][1]) == {"model": "gdn-bld", "mixer": "gdn", "size": "xs", "variant": "bld"}
    assert arm_columns(tiny["student_dir"], "s") == {"model": "s", "mixer": "gdn", "size": None, "variant": None}


# ----------------------------------------------------------------------------------------- retrieval heads

def test_retrieval_heads_tables_one_gate_per_kv_head(tiny, tmp_path):
    from hybridlab.eval.retrieval_heads import retrieval_heads_tables

    params = {"seed": 0, "retrieval_heads": {"sink": 2, "recent": 4, "steps": 2, "micro_batch_size": 2,
                                             "lr": 0.01, "l1": 0.01, "context_len": 192, "n_digits": 3,
                                             "n_train": 2, "n_test": 3}}
    alphas, curve = retrieval_heads_tables(tiny["arms"], params, mixture=tiny["mixtures"]["english"],
                                           tokenizer=tiny["tok_dir"], work=tmp_path / "work", log=_silent)
    assert alphas.columns == ["model", "layer", "kv_head", "alpha", "mixer", "size", "variant"]
    # each arm has one FA layer with one kv head
    assert alphas.select("model", "layer").rows() == [("gdn-baseline", 0), ("gdn-bld", 1)]
    assert curve.columns[-4:] == ["mixer", "size", "variant", "n"] and (curve["n"] == 3).all()
    # the masking curve: no head masked, then the one head
    assert curve.filter(pl.col("model") == "gdn-bld")["n_masked"].to_list() == [0, 1]
    assert (tmp_path / "work" / "gdn-bld").is_dir()


# ----------------------------------------------------------------------------------------- retrieval score

def test_retrieval_score_table_reads_each_arms_checkpoints(tmp_path):
    from hybridlab.data import spaced_retrieval as sr
    from hybridlab.eval.retrieval_score import ARM_COLUMNS, retrieval_score_table
    from hybridlab.models.io import save_hybrid
    from hybridlab.train import spaced_retrieval as srt

    cfg = sr.SpacedRetrievalConfig(t=3, gaps=(2, 6), gap_weights=(0.5, 0.5), n_train=0, n_val=0, n_test=8)
    test = tmp_path / "test.parquet"
    sr.write_split(test, sr.generate_split(cfg, "test"), split="test", seed=0)
    arms = []
    for arm, seed in (("longgap0.5", 1), ("baseline", 0)):
        d = tmp_path / f"{arm}-{seed}"
        mcfg = srt.SRModelConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                 intermediate_size=32, mixer_overrides={"chunk_size": 8})
        checkpoints = []
        for step, fraction in ((4, 0.5), (0, 0.0)):
            save_hybrid(srt.build_sr_model(mcfg, seed=step), d / "score_checkpoints" / f"step_{step:06d}")
            checkpoints.append({"path": f"score_checkpoints/step_{step:06d}", "step": step, "fraction": fraction})
        (d / "score_checkpoints" / "index.json").write_text(json.dumps(
            {"arm": arm, "seed": seed, "long_gap_fraction": 0.5 if arm != "baseline" else 0.0,
             "checkpoints": checkpoints}))
        arms.append(d)
    params = {"seed": 0, "max_examples_per_gap": 3, "batch_size": 4, "min_denominator": 1e-9}
    table = retrieval_score_table(arms, test, params, device="cpu", log=_silent)
    assert table.columns[:5] == ARM_COLUMNS and "score" in table.columns and "layer_type" in table.columns
    n_layers = table["layer"].n_unique()
    assert table.height == 2 * 2 * 2 * n_layers  # arms x checkpoints x gaps x layers
    assert table.select("arm", "seed", "step").unique(maintain_order=True).rows() == [
        ("baseline", 0, 0), ("baseline", 0, 4), ("longgap0.5", 1, 0), ("longgap0.5", 1, 4)]
    assert set(table.filter(pl.col("arm") == "longgap0.5")["long_gap_fraction"]) == {0.5}
    assert set(table["positions"]) == {"answer_predicting"}
    # the same checkpoint seed gives the same scores in both arms
    a, b = (table.filter((pl.col("arm") == arm) & (pl.col("step") == 4)).select("gap", "layer", "score")
            for arm in ("baseline", "longgap0.5"))
    assert a.equals(b)
    shutil.rmtree(arms[0] / "score_checkpoints")
    with pytest.raises(HybridlabError, match="index.json is missing"):
        retrieval_score_table(arms, test, params, device="cpu", log=_silent)
