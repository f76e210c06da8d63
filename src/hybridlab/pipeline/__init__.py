"""The pipeline wing: what the Snakemake rules call, above the library layers.

- `dag`: one preset's runs (teachers, students, seeds, arms, analysed models, figures) and output paths, built
  once from the config at parse time; `params`: each rule's `--params` JSON (a base of `dag.Dag`).

- `jobs`: job functions of the rules that combine several library parts (load the job's typed section, check
  its inputs, run, publish): `train`, `distill`, `models` (conversion) and `eval` (layer importance, lm-eval).
  The other evaluation and data jobs sit next to their science (`hybridlab.eval.*`, `hybridlab.data.hub`).
- `cluster`: what a job asks the cluster for: the GPU memory plan (`plan`), host memory, disk and time
  (`resources`, `disk_plan`, `model_shapes`), the torchrun launch line (`launch`) and, per rule, what it asks
  for (`requests`).
"""
