"""Language registry and Unicode script detection.

Definitions this module owns:

- A language code is FLoRes / FineWeb-2 style `<iso639-3>_<ISO 15924 script>`, e.g. `eng_Latn`,
  `tel_Telu`, `zho_Hans`. It is the project's key for a language everywhere (parquet `lang` column,
  config lists). Where a dataset spells a language differently the `Language` record says so, and
  every loader asks `dataset_config(code, dataset)` for the name (never the project code itself):

  | dataset (`DATASETS` key) | differs from the project code |
  |---|---|
  | FLoRes+ `openlanguagedata/flores_plus` (`flores_plus`) | Chinese: `cmn_Hans` / `cmn_Hant` |
  | FLORES-200 text release (`flores200`) | none (`zho_Hans`, `zho_Hant`, `pes_Arab`, ...) |
  | FineWeb-2 `HuggingFaceFW/fineweb-2` (`fineweb2`) | Chinese: `cmn_Hani` (both scripts); Persian: `fas_Arab`; no English |
  | NTREX-128 files `newstest2019-ref.<name>.txt` (`ntrex128`) | all: ISO 639-3 (`fra`, `fas`, `swa`), `srp-Cyrl`, `zho_Hans` |

  NTREX-128's English is `eng`, the source file `newstest2019-src.eng.txt`; it lacks `ary_Arab`,
  `bam_Latn`, `ory_Orya`, `asm_Beng` and `sot_Latn`.

  Where the names were checked (every code of the registry, by script, against these lists):
  * FLoRes+: the language-coverage table of the FLoRes+ 2.0-rc.3 README (github
    openlanguagedata/flores at 39f541f, the last release before that repository moved to the hub
    dataset; one `dataset_cards/<config>.md` per config, e.g. `cmn_Hans.md`). All 53 present, with
    `cmn_Hans`, `cmn_Hant`, `pes_Arab`, `ary_Arab`, `khk_Cyrl`, `npi_Deva`, `swh_Latn`. Not
    verifiable here: the gated hub card itself (configs added after 2.0-rc.3 are not needed).
  * FLORES-200: the language table of github facebookresearch/flores `flores200/README.md` (all 53
    present under the project code: `zho_Hans`, `zho_Hant`, `pes_Arab`, ...).
  * FineWeb-2: the `subset` column of `fineweb2-language-distribution.csv` in github
    huggingface/fineweb-2 (d0defb2), which lists the hub dataset's subsets and splits: `cmn_Hani`
    and `fas_Arab` exist, `pes_Arab`, `zho_Hans`, `cmn_Hans` and `eng_Latn` do not; the other 51
    codes exist under the project code. FineWeb-2 has one Mandarin subset, so `zho_Hans` and
    `zho_Hant` share `cmn_Hani` (a corpus may list only one of them). The hub card's YAML config
    list itself was not readable here; the per-language filter configs `configs/<subset>.yml` of the
    same repository agree.
  * `yor_Latn` and `sot_Latn` (added after those 53, for the real-text preset): present in the
    FLORES-200 devtest files of Helsinki-NLP/OPUS-MT-testsets (ac0f19c) and as FineWeb-2
    `configs/yor_Latn.yml` / `configs/sot_Latn.yml`; not checked against the FLoRes+ table.
  * NTREX-128: the file listing of `datasets/microsoft/ntrex/NTREX/NTREX-128/` in github
    Helsinki-NLP/OPUS-MT-testsets (ac0f19c, the copy shipped under `data/ntrex128`) and its
    `LANGUAGES.tsv`; where NTREX has several files for a language the registry takes the one in the
    code's script and standard variety (`srp-Cyrl`, not `srp-Latn`; `zho_Hans`; `fas` Persian, not
    `prs` Dari; `spa` and `por`, not `spa-MX` / `por-BR`), each file's script checked with
    `dominant_script`.
- `gettext_locales` are the locale directory names under which Debian/Ubuntu packages ship a
  language's `.mo` catalogues (`te`, `zh_CN`, `sr`...), most preferred first. LibreOffice spells them
  with a hyphen (`zh-CN`); `normalise_locale` maps both to the underscore form. Script variants that
  are *not* the language's script are deliberately absent (`sr@latin` is not `srp_Cyrl`).
- `FLORES_PAPER_LANGUAGES`: the 13 FLoRes languages of the multilinguality study.
- `FINEWEB2_PROJECT_LANGUAGES`: 26 FineWeb-2 languages. The paper does not publish its list; this is
  THIS PROJECT'S choice: the 8 low-resource, non-Latin-script languages the study singles out (Telugu,
  Malayalam, Tamil, Burmese, Khmer, Tibetan, Amharic, Armenian) plus 18 picked for script and family
  diversity (Devanagari, Bengali, Thai, Cyrillic, two Arabic-script languages, Han, Japanese, Hangul,
  Greek, Hebrew, Georgian, Sinhala, Gujarati, Kannada, and Latin-script French, Turkish and Swahili).
- `script_fraction(text, script)`: among the *letters* of `text` (Unicode categories L* and M*,
  excluding script-neutral combining diacritics), the fraction that lie in the Unicode blocks this
  module assigns to the ISO 15924 `script`. Digits, punctuation, symbols and spaces are ignored.
  `Hans`, `Hant` and `Hani` share the CJK ideograph blocks (blocks cannot tell simplified from
  traditional); `Jpan` = Han + Hiragana + Katakana; `Kore` = Hangul + Han.
- `dominant_script(text)`: the script holding the most letters (`Jpan` when Han text carries kana,
  `Hani` for Han text without kana), or None for text without letters.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from hybridlab.errors import HybridlabError

ENGLISH = "eng_Latn"

_CODE_RE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")


@dataclass(frozen=True)
class Language:
    code: str                          # project key, e.g. "tel_Telu"
    iso639_3: str                      # "tel"
    script: str                        # ISO 15924, "Telu"
    name: str
    gettext_locales: tuple[str, ...]   # Debian catalogue locale dirs, most preferred first
    flores_config: str | None          # config name in openlanguagedata/flores_plus (None: absent)
    fineweb2_config: str | None        # config name in HuggingFaceFW/fineweb-2 (None: absent)
    flores200_code: str | None = None  # file name stem in the FLORES-200 text release (None: absent)
    ntrex128_code: str | None = None   # <name> of NTREX-128's newstest2019-ref.<name>.txt (None: absent)


def _lang(code: str, name: str, locales: tuple[str, ...], flores: str | None = "",
          fineweb2: str | None = "", flores200: str | None = "", ntrex128: str | None = "") -> Language:
    iso, script = code.split("_")
    # "" means "same as the project code" (NTREX-128: the ISO 639-3 code); None means the dataset has
    # no such config.
    def same(v):
        return code if v == "" else v
    return Language(code, iso, script, name, locales, same(flores), same(fineweb2), same(flores200),
                    iso if ntrex128 == "" else ntrex128)


_LANGUAGES = [
    _lang("eng_Latn", "English", (), fineweb2=None),  # English is the msgid side; FineWeb-2 has none
    # -- the 13 FLoRes languages of the multilinguality study
    _lang("fra_Latn", "French", ("fr", "fr_FR")),
    _lang("zho_Hans", "Chinese (Simplified)", ("zh_CN", "zh_SG"), flores="cmn_Hans", fineweb2="cmn_Hani",
          ntrex128="zho_Hans"),
    _lang("hin_Deva", "Hindi", ("hi", "hi_IN")),
    _lang("tha_Thai", "Thai", ("th", "th_TH")),
    _lang("pes_Arab", "Persian", ("fa", "fa_IR"), fineweb2="fas_Arab", ntrex128="fas"),  # FineWeb-2: fas_Arab only
    _lang("ben_Beng", "Bengali", ("bn", "bn_BD", "bn_IN")),
    _lang("srp_Cyrl", "Serbian (Cyrillic)", ("sr", "sr_RS"), ntrex128="srp-Cyrl"),
    _lang("ary_Arab", "Moroccan Arabic", ("ary",), ntrex128=None),
    _lang("arb_Arab", "Modern Standard Arabic", ("ar",)),
    _lang("lit_Latn", "Lithuanian", ("lt",)),
    _lang("bam_Latn", "Bambara", ("bm",), ntrex128=None),
    _lang("ory_Orya", "Odia", ("or",), ntrex128=None),
    _lang("asm_Beng", "Assamese", ("as",), ntrex128=None),
    # -- FineWeb-2 project languages not listed above
    _lang("tel_Telu", "Telugu", ("te",)),
    _lang("mal_Mlym", "Malayalam", ("ml",)),
    _lang("tam_Taml", "Tamil", ("ta",)),
    _lang("mya_Mymr", "Burmese", ("my",)),
    _lang("khm_Khmr", "Khmer", ("km",)),
    _lang("bod_Tibt", "Tibetan", ("bo",)),
    _lang("amh_Ethi", "Amharic", ("am",)),
    _lang("hye_Armn", "Armenian", ("hy",)),
    _lang("rus_Cyrl", "Russian", ("ru",)),
    _lang("jpn_Jpan", "Japanese", ("ja",)),
    _lang("kor_Hang", "Korean", ("ko",)),
    _lang("kan_Knda", "Kannada", ("kn",)),
    _lang("sin_Sinh", "Sinhala", ("si",)),
    _lang("lao_Laoo", "Lao", ("lo",)),
    _lang("kat_Geor", "Georgian", ("ka",)),
    _lang("ell_Grek", "Greek", ("el",)),
    _lang("heb_Hebr", "Hebrew", ("he",)),
    _lang("tur_Latn", "Turkish", ("tr",)),
    _lang("vie_Latn", "Vietnamese", ("vi",)),
    _lang("swh_Latn", "Swahili", ("sw",), ntrex128="swa"),
    # -- further languages with usable offline catalogues (extra scripts and families)
    _lang("dzo_Tibt", "Dzongkha", ("dz",)),
    _lang("zho_Hant", "Chinese (Traditional)", ("zh_TW", "zh_HK"), flores="cmn_Hant", fineweb2="cmn_Hani",
          ntrex128="zho_Hant"),
    _lang("ukr_Cyrl", "Ukrainian", ("uk",)),
    _lang("bul_Cyrl", "Bulgarian", ("bg",)),
    _lang("kaz_Cyrl", "Kazakh", ("kk",)),
    _lang("khk_Cyrl", "Mongolian", ("mn",), ntrex128="mon"),
    _lang("mar_Deva", "Marathi", ("mr",)),
    _lang("npi_Deva", "Nepali", ("ne",), ntrex128="nep"),
    _lang("guj_Gujr", "Gujarati", ("gu",)),
    _lang("pan_Guru", "Punjabi", ("pa", "pa_IN")),
    _lang("urd_Arab", "Urdu", ("ur",)),
    _lang("uig_Arab", "Uyghur", ("ug",)),
    _lang("deu_Latn", "German", ("de",)),
    _lang("spa_Latn", "Spanish", ("es",)),
    _lang("por_Latn", "Portuguese", ("pt", "pt_PT")),
    _lang("pol_Latn", "Polish", ("pl",)),
    _lang("fin_Latn", "Finnish", ("fi",)),
    _lang("ind_Latn", "Indonesian", ("id",)),
    _lang("eus_Latn", "Basque", ("eu",)),
    # -- African languages of the real-text preset
    _lang("yor_Latn", "Yoruba", ("yo",)),
    _lang("sot_Latn", "Southern Sotho", ("st",), ntrex128=None),
]

LANGUAGES: dict[str, Language] = {lang.code: lang for lang in _LANGUAGES}

FLORES_PAPER_LANGUAGES: tuple[str, ...] = (
    "fra_Latn", "zho_Hans", "hin_Deva", "tha_Thai", "pes_Arab", "ben_Beng", "srp_Cyrl",
    "ary_Arab", "arb_Arab", "lit_Latn", "bam_Latn", "ory_Orya", "asm_Beng",
)

FINEWEB2_PROJECT_LANGUAGES: tuple[str, ...] = (
    # the study's low-resource non-Latin languages
    "tel_Telu", "mal_Mlym", "tam_Taml", "mya_Mymr", "khm_Khmr", "bod_Tibt", "amh_Ethi", "hye_Armn",
    # project choice for script / family diversity (same list as config.yaml `languages.fineweb2_project`)
    "hin_Deva", "ben_Beng", "tha_Thai", "rus_Cyrl", "arb_Arab", "pes_Arab", "zho_Hans", "jpn_Jpan",
    "kor_Hang", "ell_Grek", "heb_Hebr", "kat_Geor", "sin_Sinh", "guj_Gujr", "kan_Knda", "fra_Latn",
    "tur_Latn", "swh_Latn",
)


def validate_code(code: str) -> str:
    """Return `code` if it has the `xxx_Yyyy` syntax, else raise HybridlabError."""
    if not isinstance(code, str) or not _CODE_RE.match(code):
        raise HybridlabError(f"malformed language code {code!r}; use iso639-3 + '_' + ISO 15924 script, "
                             f"e.g. 'eng_Latn' or 'tel_Telu'")
    return code


def get_language(code: str) -> Language:
    """The registry entry for `code`; HybridlabError for malformed or unknown codes."""
    validate_code(code)
    if code not in LANGUAGES:
        raise HybridlabError(f"unknown language code '{code}'; known codes: {', '.join(sorted(LANGUAGES))}")
    return LANGUAGES[code]


# Datasets that name languages, with the Language field holding each one's name for a language.
DATASETS: dict[str, tuple[str, str]] = {
    "flores_plus": ("FLoRes+ (openlanguagedata/flores_plus)", "flores_config"),
    "flores200": ("the FLORES-200 text release", "flores200_code"),
    "fineweb2": ("FineWeb-2 (HuggingFaceFW/fineweb-2)", "fineweb2_config"),
    "ntrex128": ("NTREX-128", "ntrex128_code"),
}


def dataset_config(code: str, dataset: str) -> str:
    """The config / file name `dataset` uses for project language `code`; HybridlabError if it has none."""
    if dataset not in DATASETS:
        raise HybridlabError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
    title, field = DATASETS[dataset]
    name = getattr(get_language(code), field)
    if name is None:
        raise HybridlabError(f"{title} has no language {code}; drop {code} from the list that reads {title}")
    return name


def normalise_locale(locale: str) -> str:
    """Catalogue directory name -> gettext form: LibreOffice's `zh-CN` becomes `zh_CN`."""
    return locale.replace("-", "_")


@lru_cache(maxsize=1)
def _locale_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for lang in _LANGUAGES:
        for loc in lang.gettext_locales:
            if loc in index:
                raise AssertionError(f"locale {loc} claimed by {index[loc]} and {lang.code}")
            index[loc] = lang.code
    return index


def language_for_locale(locale: str) -> str | None:
    """The language code whose catalogues live under `locale` (e.g. `sr` -> `srp_Cyrl`), or None."""
    return _locale_index().get(normalise_locale(locale))


# ---------------------------------------------------------------------------------- script detection

# Unicode block ranges per base script (inclusive). Only letters/marks inside them count.
_BASE_RANGES: dict[str, tuple[tuple[int, int], ...]] = {
    "Latn": ((0x41, 0x5A), (0x61, 0x7A), (0xAA, 0xAA), (0xBA, 0xBA), (0xC0, 0xD6), (0xD8, 0xF6),
             (0xF8, 0x2AF), (0x1D00, 0x1DBF), (0x1E00, 0x1EFF), (0x2C60, 0x2C7F), (0xA720, 0xA7FF),
             (0xAB30, 0xAB6F), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A)),
    "Grek": ((0x370, 0x3FF), (0x1F00, 0x1FFF)),
    "Cyrl": ((0x400, 0x52F), (0x1C80, 0x1C8F), (0x2DE0, 0x2DFF), (0xA640, 0xA69F)),
    "Armn": ((0x530, 0x58F), (0xFB13, 0xFB17)),
    "Hebr": ((0x590, 0x5FF), (0xFB1D, 0xFB4F)),
    "Arab": ((0x600, 0x6FF), (0x750, 0x77F), (0x870, 0x8FF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)),
    "Syrc": ((0x700, 0x74F),),
    "Thaa": ((0x780, 0x7BF),),
    "Nkoo": ((0x7C0, 0x7FF),),
    "Deva": ((0x900, 0x97F), (0xA8E0, 0xA8FF)),
    "Beng": ((0x980, 0x9FF),),
    "Guru": ((0xA00, 0xA7F),),
    "Gujr": ((0xA80, 0xAFF),),
    "Orya": ((0xB00, 0xB7F),),
    "Taml": ((0xB80, 0xBFF),),
    "Telu": ((0xC00, 0xC7F),),
    "Knda": ((0xC80, 0xCFF),),
    "Mlym": ((0xD00, 0xD7F),),
    "Sinh": ((0xD80, 0xDFF),),
    "Thai": ((0xE00, 0xE7F),),
    "Laoo": ((0xE80, 0xEFF),),
    "Tibt": ((0xF00, 0xFFF),),
    "Mymr": ((0x1000, 0x109F), (0xA9E0, 0xA9FF), (0xAA60, 0xAA7F)),
    "Geor": ((0x10A0, 0x10FF), (0x1C90, 0x1CBF), (0x2D00, 0x2D2F)),
    "Hang": ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7FF), (0xFFA0, 0xFFDC)),
    "Ethi": ((0x1200, 0x139F), (0x2D80, 0x2DDF), (0xAB00, 0xAB2F)),
    "Cher": ((0x13A0, 0x13FF),),
    "Khmr": ((0x1780, 0x17FF), (0x19E0, 0x19FF)),
    "Mong": ((0x1800, 0x18AF),),
    "Tfng": ((0x2D30, 0x2D7F),),
    "Hani": ((0x2E80, 0x2FDF), (0x3005, 0x3007), (0x3021, 0x3029), (0x3038, 0x303B), (0x3400, 0x4DBF),
             (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x323AF)),
    "Hira": ((0x3040, 0x309F),),
    "Kana": ((0x30A0, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9F)),
}

# Composite ISO 15924 codes -> the base scripts whose letters they accept.
_COMPOSITE: dict[str, tuple[str, ...]] = {
    "Hans": ("Hani",), "Hant": ("Hani",), "Jpan": ("Hani", "Hira", "Kana"), "Kore": ("Hang", "Hani"),
}

# Combining diacritics shared by all scripts (Unicode script "Inherited"): neutral, not counted.
_NEUTRAL_MARKS = ((0x300, 0x36F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F))

SCRIPTS: tuple[str, ...] = tuple(sorted(set(_BASE_RANGES) | set(_COMPOSITE)))

# Sorted (lo, hi, base script) intervals for a bisect lookup.
_TABLE: list[tuple[int, int, str]] = sorted(
    (lo, hi, script) for script, ranges in _BASE_RANGES.items() for lo, hi in ranges)
_STARTS: list[int] = [lo for lo, _, _ in _TABLE]


@lru_cache(maxsize=65536)
def _char_script(ch: str) -> str | None:
    """Base script of a letter/mark, "Zzzz" for a letter outside every known block, None for non-letters."""
    if unicodedata.category(ch)[0] not in "LM":
        return None
    cp = ord(ch)
    if any(lo <= cp <= hi for lo, hi in _NEUTRAL_MARKS):
        return None
    i = bisect.bisect_right(_STARTS, cp) - 1
    if i >= 0:
        lo, hi, script = _TABLE[i]
        if lo <= cp <= hi:
            return script
    return "Zzzz"


def _base_scripts(script: str) -> tuple[str, ...]:
    if script in _COMPOSITE:
        return _COMPOSITE[script]
    if script in _BASE_RANGES:
        return (script,)
    raise HybridlabError(f"unknown script code {script!r}; known ISO 15924 codes: {', '.join(SCRIPTS)}")


def script_counts(text: str) -> dict[str, int]:
    """Number of letters per base script (unknown-block letters under "Zzzz")."""
    counts: dict[str, int] = {}
    for ch in text:
        s = _char_script(ch)
        if s is not None:
            counts[s] = counts.get(s, 0) + 1
    return counts


def script_fraction(text: str, script: str) -> float:
    """Fraction of the letters of `text` written in `script` (0.0 when `text` has no letters)."""
    bases = _base_scripts(script)
    counts = script_counts(text)
    total = sum(counts.values())
    if total == 0:
        return 0.0
    return sum(counts.get(b, 0) for b in bases) / total


def dominant_script(text: str) -> str | None:
    """The script with the most letters in `text`: Han with kana counts as `Jpan`, Han alone as `Hani`."""
    counts = script_counts(text)
    counts.pop("Zzzz", None)
    if not counts:
        return None
    kana = counts.pop("Hira", 0) + counts.pop("Kana", 0)
    if kana:
        counts["Jpan"] = counts.pop("Hani", 0) + kana
    # ties broken by name so the answer never depends on dict order
    return max(sorted(counts), key=lambda s: counts[s])


# Language groups of the layer importance pass and the searched placements: every language, English, the other
# Latin-script languages, the languages in other scripts.
SEARCH_GROUPS: tuple[str, ...] = ("all", "english", "latin", "nonlatin")


def language_group(code: str, english: str = ENGLISH) -> str:
    """"english", "latin" (another Latin-script language) or "nonlatin"."""
    if code == english:
        return "english"
    return "latin" if code.endswith("_Latn") else "nonlatin"
