"""OneRULER's NIAH data and scoring (Kim et al. 2025, "One ruler to measure them all"), from a local copy.

The benchmark's data directory (``OneRuler/data`` of github.com/mungg/OneRuler; config key
``eval.niah.oneruler_dir``) is read, never translated by hand:

- ``prompt/<code>/niah.txt``: a JSON object of prompt pieces per language (keys in ``PROMPT_KEYS``);
- ``vocab/100_noun_list_translated.tsv``: one column of key words per language code;
- ``books/<code>/*.txt``: the haystack text, split into sentences after ``.``, ``!``, ``?``, ``。``, ``۔``.

Prompt (OneRULER's assembly): ``task`` with the haystack as ``{context}``, then the question
(``question_single_numbers`` with ``{query1}``, or ``question_multi_numbers`` with two queries), then
``please_list``, ``if_no_numbers``, ``answer_prefix`` and ``answer_numbers``, separated by single spaces
except in Chinese and Japanese. Needles are ``needle_numbers`` plus the language's full stop; haystack
sentences are joined by a space (no separator in Chinese and Japanese). Tasks follow its config: the
multi-query task asks for two keys (this project's own templates ask for four).

Scoring (OneRULER's evaluation; ``score_oneruler``): text is NFKC-normalised. For number tasks a none
word in the answer fails it; otherwise the distinct numbers of two or more digits in the answer must be
exactly the expected set (no extra, none missing). For niah_none the answer, lowercased with spaces and
zero-width non-joiners removed, must contain a none word. ``score`` is the same 0/1 value (OneRULER has
no partial credit).
"""

from __future__ import annotations

import csv
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from hybridlab.errors import HybridlabError

# project language code -> OneRULER's directory / column code (its 26 languages)
CODES = {
    "eng_Latn": "en", "deu_Latn": "de", "fra_Latn": "fr", "spa_Latn": "es", "ita_Latn": "it", "por_Latn": "pt",
    "nld_Latn": "nl", "pol_Latn": "pl", "rus_Cyrl": "ru", "ukr_Cyrl": "uk", "ces_Latn": "cs", "srp_Cyrl": "sr",
    "hun_Latn": "hu", "fin_Latn": "fi", "dan_Latn": "da", "swe_Latn": "sv", "nob_Latn": "no", "jpn_Jpan": "ja",
    "kor_Hang": "ko", "zho_Hans": "zh", "hin_Deva": "hi", "tam_Taml": "ta", "pes_Arab": "fa", "swh_Latn": "sw",
    "sot_Latn": "st", "vie_Latn": "vi",
}
PROMPT_KEYS = ("task", "needle_numbers", "question_single_numbers", "question_multi_numbers", "please_list",
               "if_no_numbers", "answer_prefix", "answer_numbers", "none")
NO_SPACE = ("zh", "ja")
FULL_STOP = {"zh": "。", "ja": "。", "fa": "۔"}
NOUNS = "vocab/100_noun_list_translated.tsv"
# Extra spellings of the none word OneRULER's evaluation also accepts (beyond each prompt file's "none").
EXTRA_NONE = {"ja": ("数字はありません",), "uk": ("нема",), "cs": ("žádná",)}


@dataclass(frozen=True)
class OneRulerLanguage:
    """One language's prompt pieces, key words, haystack sentences and none words."""

    code: str
    prompts: dict
    words: tuple[str, ...]
    sentences: tuple[str, ...]
    none_words: tuple[str, ...]

    @property
    def sep(self) -> str:
        return "" if self.code in NO_SPACE else " "

    def needle(self, key: str, value: str) -> str:
        return self.prompts["needle_numbers"].format(key=key, value=value).rstrip() + FULL_STOP.get(self.code, ".")

    def prompt(self, context: str, queries: list[str]) -> str:
        p, sep = self.prompts, self.sep
        if len(queries) == 1:
            question = p["question_single_numbers"].format(query1=queries[0])
        elif len(queries) == 2:
            question = p["question_multi_numbers"].format(query1=queries[0], query2=queries[1])
        else:
            raise HybridlabError(f"OneRULER questions ask for one or two keys, got {len(queries)}")
        task = p["task"].replace("{context}", context)  # the haystack may contain braces
        return (task + question + sep + p["please_list"] + sep + p["if_no_numbers"]
                + p["answer_prefix"] + sep + p["answer_numbers"])


def _split_sentences(text: str) -> list[str]:
    text = re.sub(r"\s+", " ", text).strip()
    return [s.strip() for s in re.split(r"(?<=[.!?。۔])\s*", text) if s.strip()]


def load_language(data_dir: str | Path, lang: str) -> OneRulerLanguage:
    """The OneRULER data of one project language (see module docstring); one-line errors name the fix."""
    data = Path(data_dir)
    if lang not in CODES:
        raise HybridlabError(f"OneRULER has no {lang} (its languages: {', '.join(sorted(CODES))}); remove it from "
                             "eval.niah.languages or set eval.niah.prompts: project")
    code = CODES[lang]
    prompt_file = data / "prompt" / code / "niah.txt"
    if not prompt_file.is_file():
        raise HybridlabError(f"OneRULER prompts {prompt_file} are missing; point eval.niah.oneruler_dir at the "
                             "data directory of a OneRuler checkout (github.com/mungg/OneRuler, OneRuler/data)")
    try:
        prompts = json.loads(prompt_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise HybridlabError(f"OneRULER prompts {prompt_file} are not JSON ({err.msg}); restore the file") from err
    missing = [k for k in PROMPT_KEYS if k not in prompts]
    if missing:
        raise HybridlabError(f"OneRULER prompts {prompt_file} lack {missing}; restore the file")
    nouns = data / NOUNS
    if not nouns.is_file():
        raise HybridlabError(f"OneRULER key words {nouns} are missing; use a complete OneRuler data directory")
    with open(nouns, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    words = tuple(dict.fromkeys(r[code].strip() for r in rows if r.get(code) and r[code].strip()))
    if len(words) < 5:
        raise HybridlabError(f"{nouns} has {len(words)} key words for {code}; OneRULER's tasks need at least 5")
    books = sorted((data / "books" / code).glob("*.txt"))
    if not books:
        raise HybridlabError(f"OneRULER has no haystack books in {data / 'books' / code}; use a complete data directory")
    sentences = tuple(s for b in books for s in _split_sentences(b.read_text(encoding="utf-8", errors="replace")))
    none = (prompts["none"], *EXTRA_NONE.get(code, ()))
    return OneRulerLanguage(code, prompts, words, sentences, none)


def _clean(text: str) -> str:
    return text.strip().lower().replace("\u200c", "").replace(" ", "")


def score_oneruler(prediction: str, answers: tuple[str, ...], task: str, none_words: tuple[str, ...]) -> tuple[float, bool]:
    """(score, correct) by OneRULER's rules (see module docstring); ``answers`` is empty for niah_none."""
    text = unicodedata.normalize("NFKC", prediction or "")
    if task == "niah_none":
        cleaned = re.sub(r"\b\d\b", "", _clean(text))
        ok = any(_clean(w) in cleaned for w in none_words)
        return float(ok), ok
    if not text or any(w in text or _clean(w) in text for w in none_words):
        return 0.0, False
    found = list(dict.fromkeys(n for n in re.findall(r"\d+", text) if len(n) > 1))
    ok = len(found) == len(answers) and {int(n) for n in found} == {int(a) for a in answers}
    return float(ok), ok
