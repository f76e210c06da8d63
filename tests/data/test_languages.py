"""Language registry and script detection against hand-counted strings."""

import pytest

from hybridlab.data.languages import (
    DATASETS,
    ENGLISH,
    FINEWEB2_PROJECT_LANGUAGES,
    FLORES_PAPER_LANGUAGES,
    LANGUAGES,
    SCRIPTS,
    dataset_config,
    dominant_script,
    get_language,
    language_for_locale,
    normalise_locale,
    script_counts,
    script_fraction,
    validate_code,
)
from hybridlab.errors import HybridlabError


def test_constant_lists_are_the_documented_sizes_and_registered():
    assert ENGLISH == "eng_Latn"
    assert len(FLORES_PAPER_LANGUAGES) == 13 == len(set(FLORES_PAPER_LANGUAGES))
    assert len(FINEWEB2_PROJECT_LANGUAGES) == 26 == len(set(FINEWEB2_PROJECT_LANGUAGES))
    for code in (ENGLISH, *FLORES_PAPER_LANGUAGES, *FINEWEB2_PROJECT_LANGUAGES):
        assert code in LANGUAGES
    for code in ("tel_Telu", "mal_Mlym", "tam_Taml", "mya_Mymr", "khm_Khmr", "bod_Tibt", "amh_Ethi", "hye_Armn"):
        assert code in FINEWEB2_PROJECT_LANGUAGES


def test_registry_entries_are_consistent():
    for code, lang in LANGUAGES.items():
        assert validate_code(code) == code
        assert lang.code == code == f"{lang.iso639_3}_{lang.script}"
        assert lang.script in SCRIPTS
    # hub spellings that differ from the project code
    zh = get_language("zho_Hans")
    assert (zh.flores_config, zh.fineweb2_config, zh.gettext_locales[0]) == ("cmn_Hans", "cmn_Hani", "zh_CN")
    assert get_language("tel_Telu").fineweb2_config == "tel_Telu"
    assert get_language(ENGLISH).fineweb2_config is None  # FineWeb-2 has no English


def test_dataset_config_names_checked_against_the_datasets_lists():
    # FLoRes+ 2.0 coverage table, FLORES-200 language table, FineWeb-2 subset list (see languages docstring)
    expect = {"zho_Hans": ("cmn_Hans", "zho_Hans", "cmn_Hani"), "zho_Hant": ("cmn_Hant", "zho_Hant", "cmn_Hani"),
              "pes_Arab": ("pes_Arab", "pes_Arab", "fas_Arab"), "ary_Arab": ("ary_Arab", "ary_Arab", "ary_Arab"),
              "jpn_Jpan": ("jpn_Jpan", "jpn_Jpan", "jpn_Jpan"), "kor_Hang": ("kor_Hang", "kor_Hang", "kor_Hang")}
    for code, names in expect.items():
        assert tuple(dataset_config(code, d) for d in ("flores_plus", "flores200", "fineweb2")) == names
    assert dataset_config(ENGLISH, "flores_plus") == ENGLISH
    with pytest.raises(HybridlabError, match="FineWeb-2 .* has no language eng_Latn") as info:
        dataset_config(ENGLISH, "fineweb2")
    assert "\n" not in str(info.value)
    with pytest.raises(HybridlabError, match="unknown dataset 'c4'"):
        dataset_config("tel_Telu", "c4")
    # only the documented languages differ from the project code (NTREX-128 spells every language its
    # own way: tests/data/test_real_text.py checks those names against the shipped files)
    differs = {(c, d) for c in LANGUAGES for d in DATASETS if d != "ntrex128"
               if (n := getattr(LANGUAGES[c], DATASETS[d][1])) is not None and n != c}
    assert differs == {("zho_Hans", "flores_plus"), ("zho_Hant", "flores_plus"), ("zho_Hans", "fineweb2"),
                       ("zho_Hant", "fineweb2"), ("pes_Arab", "fineweb2")}


@pytest.mark.parametrize("code", ["eng_latn", "en_Latn", "eng-Latn", "engl_Latn", "eng_LATN", "", "eng_Latn "])
def test_validate_code_rejects_malformed(code):
    with pytest.raises(HybridlabError, match="malformed language code"):
        validate_code(code)


def test_get_language_unknown_code_names_the_known_ones():
    with pytest.raises(HybridlabError) as err:
        get_language("xyz_Latn")
    msg = str(err.value)
    assert msg.startswith("unknown language code 'xyz_Latn'; known codes:")
    assert "tel_Telu" in msg and "\n" not in msg


def test_locale_lookup():
    assert language_for_locale("sr") == "srp_Cyrl"
    assert language_for_locale("sr@latin") is None  # Latin-script Serbian is not srp_Cyrl
    assert language_for_locale("zh-CN") == "zho_Hans"  # LibreOffice spelling
    assert language_for_locale("zh_TW") == "zho_Hant"
    assert language_for_locale("te") == "tel_Telu"
    assert language_for_locale("en_GB") is None
    assert normalise_locale("pt-BR") == "pt_BR"


@pytest.mark.parametrize(
    "text, script, expected",
    [
        ("abc тест", "Latn", 3 / 7),
        ("abc тест", "Cyrl", 4 / 7),
        ("ab 12, !? 34", "Latn", 1.0),              # digits / punctuation / spaces ignored
        ("nai\u0308ve", "Latn", 1.0),                # combining diaeresis is script-neutral
        ("తెలుగు", "Telu", 1.0),                     # vowel signs (category M) count as Telugu
        ("తెలుగు abcd", "Telu", 6 / 10),
        ("日本語のテキスト", "Jpan", 1.0),
        ("日本語のテキスト", "Hans", 3 / 8),          # 3 Han, 1 Hiragana, 4 Katakana
        ("한국어 텍스트", "Kore", 1.0),
        ("中文文本", "Hant", 1.0),                    # blocks cannot tell simplified from traditional
        ("བོད་ཡིག", "Tibt", 1.0),
        ("ቋንቋ", "Ethi", 1.0),
        ("Հայերեն", "Armn", 1.0),
        ("ភាសាខ្មែរ", "Khmr", 1.0),
        ("မြန်မာ", "Mymr", 1.0),
        ("ଓଡ଼ିଆ", "Orya", 1.0),
        ("العربية", "Arab", 1.0),
        ("", "Latn", 0.0),
        ("123 ...", "Latn", 0.0),
    ],
)
def test_script_fraction_hand_counted(text, script, expected):
    assert script_fraction(text, script) == pytest.approx(expected)


def test_script_counts_hand_counted():
    assert script_counts("Ab1 Яд!") == {"Latn": 2, "Cyrl": 2}


def test_script_fraction_unknown_script_is_a_user_error():
    with pytest.raises(HybridlabError, match="unknown script code 'Abcd'"):
        script_fraction("text", "Abcd")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Hello, world!", "Latn"),
        ("Привет, мир", "Cyrl"),
        ("中文文本", "Hani"),
        ("日本語のテキスト", "Jpan"),
        ("한국어", "Hang"),
        ("Outlook Express ସନ୍ଦେଶଗୁଡ଼ିକୁ ଆମଦାନୀ କରନ୍ତୁ", "Orya"),
        ("ab вг", "Cyrl"),  # tie: alphabetical first, never dict order
        ("12 + 3 = 15", None),
    ],
)
def test_dominant_script(text, expected):
    assert dominant_script(text) == expected
