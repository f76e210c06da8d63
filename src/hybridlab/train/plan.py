"""Memory plan: estimated peak bytes per rank of every training and evaluation job of a preset.

Public API (stable; benchmarks/gpu_acceptance.py calls the first two):

    estimate_step(config, *, micro_batch, seq_len, world_size=1, task="lm", mixer=None, mixer_layers=0,
                  mixer_overrides=None, teacher=None, precision="bf16", checkpointing=True,
                  optimizer="adamw", chunk_tokens=1024, vocab_chunk=None, logits="chunked",
                  teacher_sharded=None, overhead_bytes=None) -> Estimate
        One training step (forward + backward + optimizer step) of the model of `config` (a transformers
        config, a config.json dict, a local model directory, or a hub name in KNOWN_MODELS; no network).
        task: "lm" (next-token CE), "stage1" (distillation: mixers align to the teacher's attention
        outputs, only mixers train), "stage2" (logit KL to the teacher). mixer / mixer_layers: the hybrid
        student's mixer kind and how many layers are mixers (0 = dense). precision "bf16" = FSDP2 mixed
        precision on CUDA (fp32 sharded master weights, gradients and optimizer state, bf16 compute);
        "fp32" = plain fp32 (the CPU check). teacher: the teacher's config for stage 1/2 (default:
        `config`); teacher_sharded None = replicate if it fits, else shard.
    measure_peak_bytes(fn) -> (result, peak_bytes)
        Runs fn() and returns its result and the peak of live tensor-storage bytes allocated during it
        (above what was live before; a TorchDispatchMode that tracks output storages with weakref
        finalizers). Compare with CUDA's max_memory_allocated() - memory_allocated() at entry.
    estimate_forward(config, *, batch, seq_len, ...) / estimate_generate(config, *, batch, context, ...)
        Evaluation forwards (no grad) and greedy generation with KV cache / recurrent state.
    plan_preset(config_dict, *, gpu_mem_gb=80, gpus=None) -> list[JobPlan]
        Every job of the active preset with its estimate and verdict (fits at N GPUs, smallest N).

`Estimate.terms` are named byte counts (parameters, gradients, optimizer, teacher, activations,
logits, cache, cuda_context); `Estimate.total` is their sum.
"""
