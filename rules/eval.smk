# Eval phase: one tidy parquet table per analysis (schemas documented in the README).

EVAL_TABLES = {
    "softcka": "SoftCKA and per-pair alignment by layer, English vs each language, hidden and attn_delta",
    "recency": "attention mass on the last w tokens and mean attention distance per FA layer and head",
    "fertility": "tokens per sentence relative to English per tokenizer and language",
    "perplexity": "per-language CE / perplexity / KL to teacher for teachers and students",
    "niah": "OneRULER-style NIAH accuracy, runtime, peak memory, OOM per language and context length",
    "retrieval_score": "Layer Retrieval Ability Score by activation patching per layer and checkpoint",
    "retrieval_heads": "DuoAttention-style per-KV-head gates and head-masking accuracy",
    "position_loss": "loss by token-position bucket and LongPPL",
}
EVAL_ISSUE = "5"


def eval_inputs(name):
    students = [f"{distill_dir(t, p, m, 'stage2')}/model.safetensors" for t, p, m in STUDENTS]
    teachers = [f"{teacher_dir(t)}/model.safetensors" for t in TEACHERS]
    if name == "fertility":
        return [CORPUS["parallel"], TOKENIZER]
    if name in ("retrieval_score",):
        return [R("train", f"bld_sr/{a}/model.safetensors") for a in bld_sr_arms()]
    if name in ("retrieval_heads", "position_loss"):
        return [R("train", f"bld_nl/{a}/model.safetensors") for a in bld_nl_arms()]
    return teachers + students + [CORPUS["parallel"], CORPUS["mono"]]


rule eval_table:
    """One analysis table; the analysis is chosen by the {analysis} wildcard."""
    input:
        lambda wc: eval_inputs(wc.analysis),
    output:
        R("eval", "{analysis}.parquet"),
    wildcard_constraints:
        analysis="|".join(EVAL_TABLES),
    params:
        what=lambda wc: EVAL_TABLES[wc.analysis],
    log:
        LOG("eval", "{analysis}"),
    benchmark:
        BENCH("eval", "{analysis}")
    resources:
        mem_mb=16000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} eval_table:{wildcards.analysis} {params.what:q} {EVAL_ISSUE} > {log} 2>&1"


rule eval:
    """Phase target: every analysis table."""
    input:
        [R("eval", f"{name}.parquet") for name in EVAL_TABLES],
