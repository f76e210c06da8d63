"""Rebuild the shipped FLORES-200 devtest and NTREX-128 files (xz) and SOURCES.tsv from a copy of the
Helsinki-NLP/OPUS-MT-testsets repository, so that every byte here can be traced to a public commit.

    python data/make_data.py <bare git dir or checkout of OPUS-MT-testsets> [commit]

Files are read with `git show <commit>:<path>` (works on a bare mirror and on a checkout) and written
byte for byte, xz-compressed (lzma preset 9 | PRESET_EXTREME). Standard library only.
"""

from __future__ import annotations

import hashlib
import lzma
import subprocess
import sys
from pathlib import Path

REPOSITORY = "https://github.com/Helsinki-NLP/OPUS-MT-testsets"
COMMIT = "ac0f19c0be3cb4e0d9450fcb2d7a9847c4bdd180"
FLORES_DIR = "datasets/facebook/flores/flores200_dataset/devtest"
NTREX_DIR = "datasets/microsoft/ntrex/NTREX/NTREX-128"
LINES = {"flores200": 1012, "ntrex128": 1997}
MAX_BYTES = 10_000_000
HERE = Path(__file__).resolve().parent

# Project language code (= FLORES-200 file stem) -> NTREX-128 file name part, None where NTREX-128 lacks
# the language. Must agree with `ntrex128_code` in src/hybridlab/data/languages.py (a test checks it).
NTREX = {
    "eng_Latn": "eng",  # NTREX's English is the source text, newstest2019-src.eng.txt
    "fra_Latn": "fra", "zho_Hans": "zho_Hans", "hin_Deva": "hin", "tha_Thai": "tha", "pes_Arab": "fas",
    "ben_Beng": "ben", "srp_Cyrl": "srp-Cyrl", "ary_Arab": None, "arb_Arab": "arb", "lit_Latn": "lit",
    "bam_Latn": None, "ory_Orya": None, "asm_Beng": None, "yor_Latn": "yor", "sot_Latn": None,
    "tel_Telu": "tel", "mal_Mlym": "mal", "tam_Taml": "tam", "mya_Mymr": "mya", "khm_Khmr": "khm",
    "bod_Tibt": "bod", "amh_Ethi": "amh", "hye_Armn": "hye", "rus_Cyrl": "rus", "jpn_Jpan": "jpn",
    "kor_Hang": "kor", "ell_Grek": "ell", "heb_Hebr": "heb", "kat_Geor": "kat", "sin_Sinh": "sin",
    "guj_Gujr": "guj", "kan_Knda": "kan", "tur_Latn": "tur", "swh_Latn": "swa",
}


def ntrex_file(name: str) -> str:
    """NTREX-128 file name for a language's name part: references, except the English source."""
    return f"newstest2019-{'src' if name == 'eng' else 'ref'}.{name}.txt"


def entries() -> list[tuple[str, str, str, str]]:
    """(dataset, lang, path in the repository, file in this repository) for every shipped file."""
    rows = [("flores200", lang, f"{FLORES_DIR}/{lang}.devtest", f"data/flores200/devtest/{lang}.devtest.xz")
            for lang in NTREX]
    rows += [("ntrex128", lang, f"{NTREX_DIR}/{ntrex_file(name)}", f"data/ntrex128/{ntrex_file(name)}.xz")
             for lang, name in NTREX.items() if name is not None]
    return rows


def git(repo: str, *args: str) -> bytes:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True).stdout


def main(repo: str, commit: str = COMMIT) -> None:
    commit = git(repo, "rev-parse", f"{commit}^{{commit}}").decode().strip()
    table = ["dataset\tlang\trepository\tcommit\tpath\tsha256\tfile\tsha256_xz"]
    total = 0
    for dataset, lang, path, file in entries():
        raw = git(repo, "show", f"{commit}:{path}")
        n = sum(1 for line in raw.decode("utf-8").split("\n") if line.strip())
        if n != LINES[dataset]:
            sys.exit(f"{path}: {n} non-empty lines, expected {LINES[dataset]}; wrong commit or file")
        packed = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
        out = HERE.parent / file
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(packed)
        total += len(packed)
        table.append("\t".join([dataset, lang, REPOSITORY, commit, path, hashlib.sha256(raw).hexdigest(), file,
                                hashlib.sha256(packed).hexdigest()]))
    (HERE / "SOURCES.tsv").write_text("\n".join(table) + "\n", encoding="utf-8")
    print(f"{len(table) - 1} files, {total} bytes compressed ({total / 1e6:.2f} MB)")
    if total > MAX_BYTES:
        sys.exit(f"the files take {total} bytes, more than the {MAX_BYTES} allowed; ship fewer languages")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
