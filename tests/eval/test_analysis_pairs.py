"""Glue of the analysis rules: which models form pairs, layer types, corpus samples, haystacks."""

import polars as pl
import pytest
import torch
from tiny_models import tiny_qwen3

from hybridlab.errors import HybridlabError
from hybridlab.eval import pairs


def _distilled(*students):
    return [{"teacher": "teacher", "teacher_path": "/m/teacher", "student": s, "student_path": f"/m/{s}",
             "tokenizer": "/m/tok"} for s in students]


def test_distilled_pairs_load_each_model_once_and_repeat_rows_per_pair():
    models = pairs.analysis_models(_distilled("sandwich-gdn", "endpoint_spread-gdn"))
    assert [m.name for m in models] == ["teacher/sandwich-gdn", "teacher", "teacher/endpoint_spread-gdn"]
    teacher = models[1]
    assert teacher.path == "/m/teacher" and not teacher.hub
    assert teacher.pairs == {"teacher/sandwich-gdn": "dense", "teacher/endpoint_spread-gdn": "dense"}
    assert models[0].pairs == {"teacher/sandwich-gdn": "hybrid"}
    assert pairs.pair_rows(teacher) == [
        {"model": "teacher", "pair": "teacher/sandwich-gdn", "role": "dense"},
        {"model": "teacher", "pair": "teacher/endpoint_spread-gdn", "role": "dense"}]


def test_hub_pairs_allow_a_model_in_two_pairs_and_a_hybrid_without_dense():
    hub = [{"name": "olmo", "hybrid": "org/OlmoHybrid", "dense": "org/Olmo3"},
           {"name": "swa-olmo", "hybrid": "org/Olmo3"},
           {"name": "ring", "hybrid": "org/Ring", "dense": "org/Ling", "trust_remote_code": True}]
    models = {m.name: m for m in pairs.analysis_models((), hub)}
    assert set(models) == {"org/OlmoHybrid", "org/Olmo3", "org/Ring", "org/Ling"}
    assert models["org/Olmo3"].pairs == {"olmo": "dense", "swa-olmo": "hybrid"}
    assert models["org/Olmo3"].tokenizer == "org/Olmo3" and models["org/Olmo3"].hub
    assert models["org/Ling"].trust_remote_code and not models["org/Olmo3"].trust_remote_code


@pytest.mark.parametrize("distilled, hub, match", [
    ((), (), "no analysis models"),
    ((), [{"name": "a", "hybrid": "x"}, {"name": "a", "hybrid": "y"}], "unique"),
    ((), [{"name": "a", "hybrid": "x", "dense": "x"}], "both hybrid and dense"),
    ((), [{"name": "a"}], "needs a name and a hybrid"),
    ([{"teacher": "t", "teacher_path": "/t", "student": "s", "student_path": "/s", "tokenizer": "/k"},
      {"teacher": "t", "teacher_path": "/other", "student": "s2", "student_path": "/s2", "tokenizer": "/k"}],
     (), "two different models"),
])
def test_bad_pair_lists_are_one_line_errors(distilled, hub, match):
    with pytest.raises(HybridlabError, match=match):
        pairs.analysis_models(distilled, hub)


def _tiny_qwen3(layers=4):
    return tiny_qwen3(seed=0, num_hidden_layers=layers, max_position_embeddings=64).eval()


def test_layer_types_of_dense_converted_and_labelled_models():
    from hybridlab.models.convert import convert_to_hybrid

    dense = _tiny_qwen3()
    assert pairs.layer_types(dense) == ["full_attention"] * 4 and pairs.fa_layers(dense) == [0, 1, 2, 3]
    hybrid = convert_to_hybrid(_tiny_qwen3(), [1, 3], "gdn", seed=0)
    assert pairs.layer_types(hybrid) == ["gdn", "full_attention", "gdn", "full_attention"]
    assert pairs.fa_layers(hybrid) == [1, 3]
    labelled = _tiny_qwen3()
    labelled.config.layer_types = ["attention", "sliding_attention", "mamba", "full_attention"]
    assert pairs.layer_types(labelled) == ["full_attention", "sliding_attention", "mamba", "full_attention"]
    assert pairs.fa_layers(labelled) == [0, 3]
    labelled.config.layer_types = ["attention"]
    with pytest.raises(HybridlabError, match="1 entries for 4 decoder layers"):
        pairs.layer_types(labelled)


def _parallel():
    rows = []
    for sid in range(10):
        rows.append({"sid": sid, "lang": "eng_Latn", "text": f"en {sid}", "source": "s"})
        rows.append({"sid": sid, "lang": "fra_Latn", "text": f"fr {sid}", "source": "s"})
        if sid % 2 == 0:  # Hindi has only the even sentences
            rows.append({"sid": sid, "lang": "hin_Deva", "text": f"hi {sid}", "source": "s"})
    return pl.DataFrame(rows)


def test_parallel_sample_aligns_languages_on_shared_sids_and_is_seeded():
    texts = pairs.parallel_sample(_parallel(), "eng_Latn", None, 4, seed=3)
    assert list(texts) == ["eng_Latn", "fra_Latn", "hin_Deva"]
    sids = [int(t.split()[1]) for t in texts["eng_Latn"]]
    assert sids == sorted(sids) and all(s % 2 == 0 for s in sids) and len(set(sids)) == 4
    for lang, prefix in (("fra_Latn", "fr"), ("hin_Deva", "hi")):
        assert texts[lang] == [f"{prefix} {s}" for s in sids]  # translation i of every language is sid i
    assert pairs.parallel_sample(_parallel(), "eng_Latn", None, 4, seed=3) == texts
    other = [pairs.parallel_sample(_parallel(), "eng_Latn", ["fra_Latn"], 4, seed=s)["eng_Latn"] for s in range(5)]
    assert len({tuple(o) for o in other}) > 1, "the sample depends on the seed"
    assert list(pairs.parallel_sample(_parallel(), "eng_Latn", ["fra_Latn"], 10, seed=0)) == ["eng_Latn", "fra_Latn"]


def test_parallel_sample_errors_name_the_fix():
    with pytest.raises(HybridlabError, match=r"\['tha_Thai'\] are not in the parallel corpus"):
        pairs.parallel_sample(_parallel(), "eng_Latn", ["tha_Thai"], 4, seed=0)
    with pytest.raises(HybridlabError, match="only 5 sentences are parallel"):
        pairs.parallel_sample(_parallel(), "eng_Latn", None, 6, seed=0)
    with pytest.raises(HybridlabError, match="no eng_Latn rows"):
        pairs.parallel_sample(_parallel().filter(pl.col("lang") != "eng_Latn"), "eng_Latn", None, 2, seed=0)


def test_token_windows_take_the_first_long_enough_documents():
    def tok(text):  # one token per character
        return {"input_ids": [ord(c) for c in text]}

    docs = ["abc", "abcdefgh", "xy", "klmnopq", "rstuvwxyz"]
    assert pairs.token_windows(tok, docs, 2, 5, "eng_Latn") == [[ord(c) for c in "abcde"],
                                                               [ord(c) for c in "klmno"]]
    with pytest.raises(HybridlabError, match="only 3 of 5 documents have >= 5 tokens, 4 needed"):
        pairs.token_windows(tok, docs, 4, 5, "eng_Latn")


def test_mono_documents_are_a_seeded_shuffle_per_language():
    mono = pl.DataFrame({"doc_id": [f"d{i}" for i in range(8)], "lang": ["eng_Latn"] * 4 + ["tel_Telu"] * 4,
                         "text": [f"t{i}" for i in range(8)], "source": ["s"] * 8})
    docs = pairs.mono_documents(mono, ["tel_Telu"], seed=1)
    assert sorted(docs["tel_Telu"]) == ["t4", "t5", "t6", "t7"]
    assert pairs.mono_documents(mono, ["tel_Telu"], seed=1) == docs
    with pytest.raises(HybridlabError, match="have no monolingual documents"):
        pairs.mono_documents(mono, ["amh_Ethi"], seed=1)


def test_haystack_sentences_split_lines_and_sentence_ends_of_several_scripts():
    text = "First one. Second one! Third?\nमेरा नाम। दूसरा वाक्य\n第一句。第二句\n\n  \nlast line"
    assert pairs.haystack_sentences([text]) == ["First one.", "Second one!", "Third?", "मेरा नाम।", "दूसरा वाक्य",
                                                "第一句。", "第二句", "last line"]
