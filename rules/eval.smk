# Eval phase: one tidy parquet table per analysis (schemas documented in the README).
# Each analysis has its own rule, named eval_<analysis>, writing results/eval/<scale>/<analysis>.parquet.

EVAL_TABLES = ["softcka", "recency", "fertility", "perplexity", "niah", "retrieval_score", "retrieval_heads",
               "position_loss"]


def distilled_students():
    """Final (stage-2) student directories: save_hybrid layout (config.json, model.safetensors, hybrid.json)."""
    return [distill_dir(t, p, m, "stage2") for t, p, m in STUDENTS]


rule eval_softcka:
    """SoftCKA and per-pair alignment by layer, English vs each language, hidden states and attn_delta."""
    input:
        teachers=[f"{teacher_dir(t)}/model.safetensors" for t in TEACHERS],
        students=[f"{d}/model.safetensors" for d in distilled_students()],
        parallel=CORPUS["parallel"],
    output:
        R("eval", "softcka.parquet"),
    log:
        LOG("eval", "softcka"),
    benchmark:
        BENCH("eval", "softcka")
    resources:
        mem_mb=16000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} eval_softcka 'SoftCKA table' 5 > {log} 2>&1"


rule eval_recency:
    """Attention mass on the last w tokens and mean attention distance per FA layer and head."""
    input:
        teachers=[f"{teacher_dir(t)}/model.safetensors" for t in TEACHERS],
        students=[f"{d}/model.safetensors" for d in distilled_students()],
        mono=CORPUS["mono"],
    output:
        R("eval", "recency.parquet"),
    log:
        LOG("eval", "recency"),
    benchmark:
        BENCH("eval", "recency")
    resources:
        mem_mb=16000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} eval_recency 'attention recency table' 5 > {log} 2>&1"


rule eval_fertility:
    """Tokens per sentence relative to English per tokenizer and language."""
    input:
        parallel=CORPUS["parallel"],
        tokenizer=TOKENIZER,
    output:
        R("eval", "fertility.parquet"),
    log:
        LOG("eval", "fertility"),
    benchmark:
        BENCH("eval", "fertility")
    resources:
        mem_mb=4000,
        runtime=20,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{NOT_READY} eval_fertility 'fertility table' 5 > {log} 2>&1"


rule eval_perplexity:
    """Per-language CE / perplexity / KL to the teacher for teachers and students; tokens to baseline."""
    input:
        teachers=[f"{teacher_dir(t)}/model.safetensors" for t in TEACHERS],
        students=[f"{d}/model.safetensors" for d in distilled_students()],
        mixture=[R("data", f"mixture/multilingual/{f}") for f in MIXTURE_FILES],
    output:
        R("eval", "perplexity.parquet"),
    log:
        LOG("eval", "perplexity"),
    benchmark:
        BENCH("eval", "perplexity")
    resources:
        mem_mb=16000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} eval_perplexity 'perplexity/KL table' 5 > {log} 2>&1"


rule eval_niah:
    """OneRULER-style NIAH accuracy, runtime, peak memory and OOM per language and context length."""
    input:
        teachers=[f"{teacher_dir(t)}/model.safetensors" for t in TEACHERS],
        students=[f"{d}/model.safetensors" for d in distilled_students()],
        mono=CORPUS["mono"],
    output:
        R("eval", "niah.parquet"),
    log:
        LOG("eval", "niah"),
    benchmark:
        BENCH("eval", "niah")
    resources:
        mem_mb=16000,
        runtime=120,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} eval_niah 'NIAH table' 5 > {log} 2>&1"


rule eval_retrieval_score:
    """Layer Retrieval Ability Score by activation patching per layer and checkpoint (Spaced Retrieval)."""
    input:
        models=lambda wc: [R("train", f"bld_sr/{a}/model.safetensors") for a in bld_sr_arms()],
        test=R("data", "spaced_retrieval/test.parquet"),
    output:
        R("eval", "retrieval_score.parquet"),
    log:
        LOG("eval", "retrieval_score"),
    benchmark:
        BENCH("eval", "retrieval_score")
    resources:
        mem_mb=8000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} eval_retrieval_score 'retrieval score table' 5 > {log} 2>&1"


rule eval_retrieval_heads:
    """DuoAttention-style per-KV-head gates and accuracy as heads are masked from lowest gate up."""
    input:
        models=lambda wc: [R("train", f"bld_nl/{a}/model.safetensors") for a in bld_nl_arms()],
    output:
        R("eval", "retrieval_heads.parquet"),
    log:
        LOG("eval", "retrieval_heads"),
    benchmark:
        BENCH("eval", "retrieval_heads")
    resources:
        mem_mb=8000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} eval_retrieval_heads 'retrieval heads table' 5 > {log} 2>&1"


rule eval_position_loss:
    """Loss by token-position bucket on long documents and LongPPL."""
    input:
        models=lambda wc: [R("train", f"bld_nl/{a}/model.safetensors") for a in bld_nl_arms()],
        mixture=[R("data", f"mixture/english/{f}") for f in MIXTURE_FILES],
    output:
        R("eval", "position_loss.parquet"),
    log:
        LOG("eval", "position_loss"),
    benchmark:
        BENCH("eval", "position_loss")
    resources:
        mem_mb=8000,
        runtime=60,
        gpu=gpus(1),
    conda:
        CUDA_ENV
    shell:
        "{NOT_READY} eval_position_loss 'position loss table' 5 > {log} 2>&1"


rule eval:
    """Phase target: every analysis table."""
    input:
        [R("eval", f"{name}.parquet") for name in EVAL_TABLES],
