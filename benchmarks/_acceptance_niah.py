"""NIAH stage of the GPU acceptance script: generation time and memory of a 4B-shaped hybrid and its dense twin.

One model per worker, `spec["model"]` = "hybrid" (the Qwen3-4B-shaped model converted with the
`standard_periodic` placement at the paper `fa_ratio`, GDN mixers) or "dense" (the same random Qwen3
model unconverted), in bf16 on CUDA (fp32 on the CPU dry run). Each context length in
`spec["contexts"]` runs greedy generation of `spec["new_tokens"]` tokens through the project's NIAH
runner (`hybridlab.eval.niah.run_niah`: `model.generate`, wall time and peak memory per example, a CUDA
out-of-memory error recorded as a row, not raised), on random token ids, after one untimed warm-up
generation that compiles the kernels. The runner reads prompts through a tokenizer, so a stub maps each
example's prompt key to its token ids. Longer contexts after an OOM are recorded as skipped OOMs.
`plan_estimate` is the memory plan's `estimate_generate` without its CUDA-context term (what
`max_memory_allocated` can see); on CPU the runner's peak is the process RSS, so no error is computed.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from _acceptance_models import MIXER, build_dense, paper_settings, plan_module, qwen3_config, to_hybrid

class IdsTokenizer:
    """Stub tokenizer for `run_niah`: a prompt is a key for prepared token ids; decoding lists the ids."""

    pad_token_id = 0
    eos_token_id = 0

    def __init__(self, prompts: dict[str, torch.Tensor]):
        self.prompts = prompts

    def __call__(self, text: str, return_tensors: str | None = None):
        return {"input_ids": self.prompts[text]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def run(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Generation time and peak memory of the 4B-shaped `spec["model"]` ("hybrid" | "dense") per context."""
    from hybridlab.eval.niah import NiahExample, run_niah as niah_runner

    cuda = not spec["dry_run"]
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    contexts = spec["contexts"]
    config = qwen3_config("qwen3_4b", spec["dry_run"], max_positions=max(contexts) + spec["new_tokens"] + 16)
    model = build_dense(config, device, dtype)
    if spec["model"] == "hybrid":
        model = to_hybrid(model, paper_settings()["fa_ratio"], device, inplace=True).to(dtype)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    warm = min(256, contexts[0])
    prompts = {f"ids-{n}": torch.randint(config.vocab_size, (1, n), generator=gen) for n in [warm, *contexts]}
    tok = IdsTokenizer(prompts)

    def example(n: int) -> NiahExample:
        return NiahExample(prompt=f"ids-{n}", answers=("0",), task="niah_single", lang="random",
                           context_tokens=n, depth=0.5, target_tokens=n)

    warm_rows = niah_runner(model, tok, [example(warm)], 2, device)  # compiles the kernels, untimed
    yield {"meta": {"model": spec["model"], "params": sum(p.numel() for p in model.parameters()),
                    "fa_layers": getattr(getattr(model, "hybridlab_spec", None), "fa_layers", None),
                    "warmup_s": warm_rows["seconds"][0], "dtype": str(dtype).replace("torch.", ""),
                    "new_tokens": spec["new_tokens"]}}
    plan, _ = plan_module()
    for n in contexts:  # one at a time, so a timeout keeps the finished lengths
        row = niah_runner(model, tok, [example(n)], spec["new_tokens"], device).row(0, named=True)
        rec = {"model": spec["model"], "context": n, "seconds": row["seconds"], "peak_bytes": row["peak_memory_bytes"],
               "memory_kind": row["memory_kind"], "oom": bool(row["oom"]), "plan_estimate": None,
               "plan_rel_err": None}
        if plan is not None and callable(getattr(plan, "estimate_generate", None)):
            try:
                mixer_layers = len(model.hybridlab_spec.mixer_layers) if spec["model"] == "hybrid" else 0
                est = plan.estimate_generate(config, batch=1, context=n, mixer=MIXER if mixer_layers else None,
                                             mixer_layers=mixer_layers, precision="bf16" if cuda else "fp32")
                rec["plan_estimate"] = int(est.total) - int(dict(est.terms).get("cuda_context", 0))
                if cuda and rec["peak_bytes"] and not rec["oom"]:  # on CPU the peak is the process RSS
                    rec["plan_rel_err"] = (rec["plan_estimate"] - rec["peak_bytes"]) / rec["peak_bytes"]
            except Exception as exc:  # noqa: BLE001
                rec["plan_reason"] = f"plan.estimate_generate failed: {type(exc).__name__}: {str(exc)[:200]}"
        yield rec
        if rec["oom"]:
            for m in contexts[contexts.index(n) + 1:]:
                yield {"model": spec["model"], "context": m, "seconds": None, "peak_bytes": None, "oom": True,
                       "skipped": True, "plan_estimate": None}
            return
