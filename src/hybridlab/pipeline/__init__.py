"""The pipeline wing: what the Snakemake rules call, above the library layers.

- `jobs`: one function per training rule (load the job's typed section, check its inputs, run, publish).
- `cluster`: what a job asks the cluster for: the GPU memory plan (`plan`), host memory, disk and time
  (`resources`, `disk_plan`, `model_shapes`) and the torchrun launch line (`launch`).
"""
