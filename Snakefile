# hybridlab: data -> models -> train -> eval -> figures, at the scale preset chosen with
# `--config scale=smoke|tiny|paper` (default: tiny, from config.yaml).
#
#   snakemake all                      # everything at the embedded default (tiny, CPU, offline)
#   snakemake data --config scale=smoke
#   snakemake -n all --config scale=paper
#
# The config is validated before any rule is built; a bad value stops here with one line.


configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/models.smk"
include: "rules/train.smk"
include: "rules/eval.smk"
include: "rules/figures.smk"


rule all:
    default_target: True
    input:
        rules.data.input,
        rules.models.input,
        rules.train.input,
        rules.eval.input,
        rules.figures.input,
