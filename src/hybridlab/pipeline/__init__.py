"""The pipeline wing: what the Snakemake rules call, above the library layers.

- `jobs`: job functions of the rules that combine several library parts (load the job's typed section, check
  its inputs, run, publish): `train`, `distill`, `models` (conversion) and `eval` (layer importance, lm-eval).
  The other evaluation and data jobs sit next to their science (`hybridlab.eval.*`, `hybridlab.data.hub`).
- `cluster`: what a job asks the cluster for: the GPU memory plan (`plan`), host memory, disk and time
  (`resources`, `disk_plan`, `model_shapes`) and the torchrun launch line (`launch`).
"""
