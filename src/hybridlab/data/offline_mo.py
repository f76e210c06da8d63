"""Gettext catalogues as parallel text: reading `.mo` files and filtering msgid -> msgstr pairs.

A `.mo` catalogue maps an English source string (msgid) to its translation (msgstr). Read as data,
each entry is one English sentence and its translation. UI catalogues are noisy, so a pair is kept
only if it survives, in this order (the first failing check names the rejection reason):

1. `placeholder`: either side holds a format or substitution slot: printf/strftime `%s`, `%-5.2f`,
   `%1$s`, `%(name)s`, `%PRODUCTNAME`; Qt/LibreOffice `%1`; shell `$var`, `${var}`, `$(var)`, `$1`;
   brace `{0}`, `{name}`, `{}`; autotools `@VAR@`.
2. `markup`: an XML/HTML tag (`<b>`, `</a>`, `<br/>`) or a character entity (`&amp;`, `&#10;`).
3. `url`: a URL (`http://`, `www.`) or an e-mail address.
4. (cleaning, never a rejection) accelerator markers are removed: `_File`, `&File`, `~File`, a
   CJK-style `(_F)` suffix, and an underscore inside a word (`Fi_le`); whitespace runs become one space.
5. `short`: the msgid has fewer than `min_english_words` whitespace-separated words.
6. `not_english`: under 90 % of the msgid's letters are Latin (some catalogues key on native text).
7. `untranslated`: the cleaned msgstr equals the cleaned msgid up to case.
8. `wrong_script`: under `min_script_fraction` of the msgstr's letters are in the target script
   (catches untranslated copies and mislabelled catalogues for non-Latin targets).

Plural entries are skipped (their msgids almost always carry a `%d`, and the forms differ per
language), as are the header, fuzzy and obsolete entries. A message context (msgctxt) is not part of
the text and is dropped.
"""

from __future__ import annotations

import re
from pathlib import Path

import polib

from hybridlab.data.languages import script_fraction
from hybridlab.errors import HybridlabError

REJECT_REASONS = ("placeholder", "markup", "url", "short", "not_english", "untranslated", "wrong_script")

_PLACEHOLDER_RE = re.compile(
    r"%(?:\([^)\s]+\))?[-+#0']*(?:\d+\$)?(?:\d+|\*)?(?:\.(?:\d+|\*))?[A-Za-z@]"  # printf, strftime, %(x)s, %NAME
    r"|%\d+"                                    # Qt / LibreOffice %1
    r"|\$\{?[A-Za-z_]\w*\}?|\$\(\w+\)|\$\d+"    # shell-style substitutions
    r"|\{[^{}\s]*\}"                            # {0} {name} {}
    r"|@\w+@"                                   # autotools @VAR@
)
_MARKUP_RE = re.compile(r"<[A-Za-z/!?][^<>]*>|&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#x[0-9A-Fa-f]+);")
_URL_RE = re.compile(r"(?:https?|ftp|file)://|\bwww\.\w|[\w.+-]+@[\w-]+\.[A-Za-z]{2,}")

# "(_F)" / "(&F)" / "(~F)" suffix used by CJK translations, with the space before it.
_ACCEL_SUFFIX_RE = re.compile(r"\s*[(（]\s*[_&~][^\s()（）]\s*[)）]")
# A marker at the start of a word: "_File", "&File", "~File" (not "R&D", not "Drag & Drop").
_ACCEL_WORD_START_RE = re.compile(r"(?<!\w)[_&~](?=[^\W_])")
# A single underscore inside a word ("Fi_le", and scripts where the marker sits mid-word).
_ACCEL_INNER_RE = re.compile(r"(?<=[^\W_])_(?=[^\W_])")
_SPACE_RE = re.compile(r"\s+")


def read_mo(source: Path | str | bytes, name: str | None = None) -> list[tuple[str, str]]:
    """(msgid, msgstr) of the translated singular entries of one `.mo` catalogue, in file order.

    `source` is a path or the catalogue's bytes; `name` labels error messages for bytes.
    """
    label = name or (str(source) if not isinstance(source, bytes) else "<bytes>")
    try:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        catalogue = polib.mofile(data)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise HybridlabError(f"cannot read gettext catalogue {label} ({type(exc).__name__}: {exc}); "
                             f"delete its package from the cache so it is downloaded again")
    pairs = []
    for entry in catalogue:
        if (not entry.msgid or entry.msgid_plural or entry.obsolete or "fuzzy" in entry.flags
                or not entry.msgstr):
            continue
        pairs.append((entry.msgid, entry.msgstr))
    return pairs


def has_placeholder(text: str) -> bool:
    return _PLACEHOLDER_RE.search(text) is not None


def has_markup(text: str) -> bool:
    return _MARKUP_RE.search(text) is not None


def has_url(text: str) -> bool:
    return _URL_RE.search(text) is not None


def strip_accelerators(text: str) -> str:
    """Remove keyboard-accelerator markers: `_File`, `&File`, `~File`, `文件(_F)`, `Fi_le`."""
    text = _ACCEL_SUFFIX_RE.sub("", text)
    text = _ACCEL_WORD_START_RE.sub("", text)
    return _ACCEL_INNER_RE.sub("", text)


def normalise_whitespace(text: str) -> str:
    return _SPACE_RE.sub(" ", text).strip()


def clean_text(text: str) -> str:
    """Accelerators removed, whitespace runs collapsed to one space, ends stripped."""
    return normalise_whitespace(strip_accelerators(text))


def filter_pair(msgid: str, msgstr: str, script: str, *, min_english_words: int,
                min_script_fraction: float) -> tuple[tuple[str, str] | None, str]:
    """Clean and check one catalogue pair for a target language written in `script`.

    Returns ((english, translation), "kept") or (None, reason) with reason in REJECT_REASONS.
    """
    for reason, test in (("placeholder", has_placeholder), ("markup", has_markup), ("url", has_url)):
        if test(msgid) or test(msgstr):
            return None, reason
    english, target = clean_text(msgid), clean_text(msgstr)
    if len(english.split()) < min_english_words:
        return None, "short"
    if script_fraction(english, "Latn") < 0.9:
        return None, "not_english"
    if target.casefold() == english.casefold():
        return None, "untranslated"
    if script_fraction(target, script) < min_script_fraction:
        return None, "wrong_script"
    return (english, target), "kept"
