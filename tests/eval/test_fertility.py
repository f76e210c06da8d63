import polars as pl
import pytest

from hybridlab.errors import HybridlabError
from hybridlab.eval.fertility import fertility, token_counts


def _parallel():
    rows = [
        ("s1", "eng_Latn", "the cat sat"),          # 3
        ("s2", "eng_Latn", "hello"),                # 1
        ("s3", "eng_Latn", "one two three four"),   # 4 (no fra translation)
        ("s1", "fra_Latn", "le chat est assis"),    # 4
        ("s2", "fra_Latn", "bon jour"),             # 2
        ("s1", "deu_Latn", "die katze"),            # 2
        ("s2", "deu_Latn", "hallo"),                # 1
        ("s3", "deu_Latn", "eins zwei drei vier fünf"),  # 5
    ]
    return pl.DataFrame(rows, schema=["sid", "lang", "text"], orient="row").with_columns(source=pl.lit("test"))


def whitespace(text):
    return text.split()


def characters(text):
    return list(text.replace(" ", ""))


def test_whitespace_fertility_hand_computed():
    df = fertility(_parallel(), {"ws": whitespace})
    assert df.columns == ["tokenizer", "lang", "n_sentences", "tokens_per_sentence", "relative_to_english",
                          "mean_sentence_ratio", "relative_to_english_lo", "relative_to_english_hi"]
    got = {r["lang"]: r for r in df.to_dicts()}
    assert got["eng_Latn"]["n_sentences"] == 3
    assert got["eng_Latn"]["tokens_per_sentence"] == pytest.approx(8 / 3)
    assert got["eng_Latn"]["relative_to_english"] == 1.0 and got["eng_Latn"]["mean_sentence_ratio"] == 1.0
    # fra over s1, s2: totals 6 / 4; per-sentence 4/3 and 2/1
    assert got["fra_Latn"]["n_sentences"] == 2
    assert got["fra_Latn"]["tokens_per_sentence"] == pytest.approx(3.0)
    assert got["fra_Latn"]["relative_to_english"] == pytest.approx(6 / 4)
    assert got["fra_Latn"]["mean_sentence_ratio"] == pytest.approx((4 / 3 + 2) / 2)
    # bootstrap over the 2 shared sids: resamples {s1, s1} 8/6, {s1, s2} 6/4, {s2, s2} 4/2, each extreme with
    # probability 1/4, so the 2.5 % and 97.5 % quantiles are the extremes; English is exactly 1
    assert (got["fra_Latn"]["relative_to_english_lo"], got["fra_Latn"]["relative_to_english_hi"]) == \
        pytest.approx((4 / 3, 2.0))
    assert got["eng_Latn"]["relative_to_english_lo"] == got["eng_Latn"]["relative_to_english_hi"] == 1.0
    # deu over s1..s3: totals 8 / 8; per-sentence 2/3, 1, 5/4
    assert got["deu_Latn"]["relative_to_english"] == pytest.approx(1.0)
    assert got["deu_Latn"]["mean_sentence_ratio"] == pytest.approx((2 / 3 + 1 + 5 / 4) / 3)


def test_several_tokenizers_are_tidy_rows():
    df = fertility(_parallel(), {"ws": whitespace, "chars": characters})
    assert df.height == 6
    chars = {r["lang"]: r for r in df.filter(pl.col("tokenizer") == "chars").to_dicts()}
    # eng chars s1=9, s2=5; fra chars s1=14, s2=7 -> 21 / 14
    assert chars["fra_Latn"]["relative_to_english"] == pytest.approx(21 / 14)


def test_token_counts_with_hf_and_tokenizers_objects_ignore_special_tokens():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<bos>": 1, "a": 2, "b": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    assert token_counts(tok, ["a b a", "b"]) == [3, 1]
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", unk_token="<unk>")
    assert token_counts(hf, ["a b a", "b"]) == [3, 1]
    with pytest.raises(HybridlabError, match="unsupported tokenizer"):
        token_counts(42, ["a"])


def test_bad_inputs_are_clear_errors():
    par = _parallel()
    with pytest.raises(HybridlabError, match="no eng_Latn rows"):
        fertility(par.filter(pl.col("lang") != "eng_Latn"), {"ws": whitespace})
    with pytest.raises(HybridlabError, match="more than once"):
        fertility(pl.concat([par, par.head(1)]), {"ws": whitespace})
    orphan = pl.concat([par, pl.DataFrame({"sid": ["s9"], "lang": ["ita_Latn"], "text": ["ciao"],
                                           "source": ["t"]})])
    with pytest.raises(HybridlabError, match="share no sid"):
        fertility(orphan, {"ws": whitespace})
    empty = par.with_columns(pl.when(pl.col("sid") == "s2").then(pl.lit("")).otherwise(pl.col("text")).alias("text"))
    with pytest.raises(HybridlabError, match="0 tokens"):
        fertility(empty, {"ws": whitespace})
    with pytest.raises(HybridlabError, match="lacks columns"):
        fertility(par.drop("text"), {"ws": whitespace})
