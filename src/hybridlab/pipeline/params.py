"""Each rule's params: the JSON a job's script reads with `--params` (one JSON string, so Snakemake reruns a rule
when what it reads changes, and only then).

`RuleParams` is a base of `hybridlab.pipeline.dag.Dag`: its methods read the resolved preset (`self.C`) and the
runs and paths the Dag enumerates. A job's params hold only the settings that job uses (editing stage 2's knobs
never reruns stage 1; adding a model reruns no other model's job; a seed's job never sees the other seeds).
"""

from __future__ import annotations

import dataclasses
import json

from hybridlab.config_spec import DISTILL_JOBS
from hybridlab.data.local_sources import DATASET_KEYS as LOCAL_DATASET_KEYS, local_sources

# The corpus step's settings: OfflineCorpusConfig fields offline, loader options for the hub.
OFFLINE_CORPUS_KEYS = [
    "parallel_languages",
    "mono_languages",
    "max_parallel_sentences",
    "min_parallel_sentences",
    "max_mono_docs_per_language",
    "sentences_per_doc",
    "english_bible_docs",
]
HUB_CORPUS_KEYS = [
    "parallel_languages",
    "mono_languages",
    "flores_split",
    "fineweb2_docs_per_language",
    "english_web",
    "english_web_docs",
]


def as_json(obj) -> str:
    """Rule params as one JSON string; Snakemake reruns a rule when its params change."""
    return json.dumps(obj, sort_keys=True)


class RuleParams:
    """The params of every rule that takes a `--params` JSON, by phase."""

    # -- data phase ---------------------------------------------------------------------------------------------

    def corpus_params(self):
        C, D = self.C, self.data
        if self.offline:
            p = {k: D[k] for k in OFFLINE_CORPUS_KEYS if k in D}
            off = C["offline"]
            p.update(seed=C["seed"], packages=off["packages"], min_english_words=off["min_english_words"])
        else:
            p = {k: D[k] for k in HUB_CORPUS_KEYS if k in D}
            # local copies in the hub layouts (config `local_sources`; None = the hub or the HF cache)
            src = local_sources(C)
            p.update(english=C["languages"]["english"], local_sources={k: src[k] for k in LOCAL_DATASET_KEYS})
            if "ntrex_sentences_per_doc" in D:
                p["ntrex_sentences_per_doc"] = D["ntrex_sentences_per_doc"]
        return as_json(p)

    def mixture_params(self, name):
        C, D = self.C, self.data
        block_rows = 1
        if name == "multilingual":
            langs, share = D["mono_languages"], D["english_share"]
        else:  # English-only text for BLD natural-language pre-training (DCLM at paper scale)
            langs, share = [], 1.0
            # A BLD-NL sequence joins context_len / seq_len consecutive rows: keep them together when shuffling.
            ctx = C.get("train", {}).get("bld_nl", {}).get("context_len", D["seq_len"])
            block_rows = ctx // D["seq_len"] if ctx % D["seq_len"] == 0 else 1
        p = {
            "languages": langs,
            "english": C["languages"]["english"],
            "english_share": share,
            "seq_len": D["seq_len"],
            "total_tokens": D["mixture_tokens"],
            "block_rows": block_rows,
            "val_fraction": D["val_fraction"],
            "seed": C["seed"],
        }
        if name == "multilingual" and D.get("heldout"):
            p["heldout"] = D["heldout"]
        if name == "english" and D.get("bld_nl_stream"):
            # Sized to the budget: stream the web source until the largest BLD-NL arm's tokens are packed.
            bld = C["train"]["bld_nl"]
            src = D["bld_nl_stream"]["source"]
            p.update(
                stream={**D["bld_nl_stream"], "path": local_sources(C)[src]},  # local copy, else the hub
                bld_nl={
                    "sizes": bld["sizes"],
                    "experiment": C["experiments"]["bld_nl"],
                    "run": {k: v for k, v in bld.items() if k != "sizes"},
                },
            )
        return as_json(p)

    # -- train phase --------------------------------------------------------------------------------------------

    def distill_params(self, stage, seed):
        """The distill_train settings one stage uses, its job section's fields; `seed` is the replicate's (data
        order; the same for every placement of that seed)."""
        d = self.C["train"]["distill"]
        keys = [f.name for f in dataclasses.fields(DISTILL_JOBS[stage]) if f.name in d]
        return as_json({**{k: d[k] for k in keys}, "seed": int(seed), **self.document_mask})

    def bld_nl_params(self, arm, seed):
        C = self.C
        a = self.nl_arms[arm]
        run = {k: v for k, v in C["train"]["bld_nl"].items() if k != "sizes"}
        # `seeds` is not passed: a job sees only its own replicate seed (adding a seed never reruns the others)
        exp = {k: v for k, v in C["experiments"]["bld_nl"].items() if k != "seeds"}
        return as_json(
            {
                "arm": {"name": a.name, "mixer": a.mixer, "size": a.size, "variant": a.variant},
                "shape": C["train"]["bld_nl"]["sizes"][a.size],
                "run": run,
                "experiment": exp,
                "seed": int(seed),
                **self.document_mask,
            }
        )

    # -- eval phase ---------------------------------------------------------------------------------------------

    def layer_importance_params(self, teacher, mixer):
        """eval.layer_importance plus the run's labels (config validation ensures the section where searched
        placements run)."""
        C = self.C
        return as_json(
            {
                **C["eval"]["layer_importance"],
                "teacher": teacher,
                "mixer": mixer,
                "english": C["languages"]["english"],
                "fa_ratio": C["experiments"]["distill"]["fa_ratio"],
                "seed": C["seed"],
            }
        )

    def _analysis_section(self, section, models):
        A = self.C["eval"]["analysis"]
        return as_json(
            {
                "models": models,
                "dtype": A["dtype"],
                "seed": self.C["seed"],
                "english": self.C["languages"]["english"],
                section: A[section],
            }
        )

    def analysis_params(self, section, seed=None):
        """Params of an analysis over every analysed model (recency, fertility)."""
        return self._analysis_section(section, self.analysis_models_param(seed))

    def model_params(self, section, slug, seed=None):
        """Params of one model's job of an analysis `section` (niah, softcka): the pairs that model belongs to
        only (adding a model reruns no other job); `seed` as analysis_models_param."""
        m = (self.niah_models if seed is None else self.softcka_models[seed])[slug]
        full = self.analysis_models_param(seed)
        models = {
            "distilled": [d for d in full["distilled"] if f"{d['teacher']}/{d['student']}" in m.pairs],
            "hub_pairs": [p for p in full["hub_pairs"] if p["name"] in m.pairs],
        }
        return self._analysis_section(section, models)

    def softcka_gather_params(self, seed):
        """Params of one seed's SoftCKA gather: its model names and its pairs (a reused teacher table holds rows
        for every first-seed pair; the gather keeps this seed's)."""
        models = self.softcka_analysed[seed].values()
        return as_json({"models": [m.name for m in models], "pairs": sorted({p for m in models for p in m.pairs})})

    def heads_position_params(self, section):
        """Params of the retrieval-heads / position-loss / lm-eval rules (presets.<scale>.eval.heads_position)."""
        return as_json(
            {
                section: self.C["eval"]["heads_position"][section],
                "seed": self.C["seed"],
                "device": "cuda" if self.on_gpu else "cpu",
                "dtype": "bfloat16" if self.paper_path else "float32",
            }
        )

    @staticmethod
    def hub_id(m):
        """The hub id of a published AnalysisModel, None for a model of the DAG (a per-model job's mem_mb)."""
        return m.path if m.hub else None
