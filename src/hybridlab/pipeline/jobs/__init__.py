"""Job functions of the training rules: `train` (teacher pre-training, the mixture packing, BLD-SR, BLD-NL) and
`distill` (the distillation stages and the assembly of a placement's stage-1 student)."""
