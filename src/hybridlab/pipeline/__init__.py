"""The pipeline wing: what the Snakemake rules call, above the library layers.

- `dag`: one preset's runs (teachers, students, seeds, arms, analysed models, figures) and output paths, built
  once from the config at parse time; `params`: each rule's `--params` JSON (a base of `dag.Dag`).

- `jobs`: one function per rule, by phase (`data`, `models`, `train`, `distill`, `eval`, `figures`), each a few
  steps: build the job's typed section, check its inputs, run the library, publish its outputs atomically. Every
  workflow script is its argument parser and one call of its rule's job; the evaluations and the columns of their
  tables stay next to their science (`hybridlab.eval.softcka.softcka_table`, ...).
- `cluster`: what a job asks the cluster for: the GPU memory plan (`plan`), host memory, disk and time
  (`resources`, `disk_plan`, `model_shapes`), the torchrun launch line (`launch`) and, per rule, what it asks
  for (`requests`).
"""
