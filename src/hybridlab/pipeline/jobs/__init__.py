"""Job functions: `train` (teacher pre-training, the mixture packing, BLD-SR, BLD-NL), `distill` (the
distillation stages and the assembly of a placement's stage-1 student), `models` (conversion) and `eval` (the
layer importance pass, the lm-eval benchmarks)."""
