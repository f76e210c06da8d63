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


# A lock left by a killed build (SIGKILL, OOM, power cut) is removed here, so the same command goes on;
# the owner record that tells a dead build from a live one is written once the build starts.
if workflow.is_main_process:
    _stale = clear_stale_lock()
    if _stale:
        print(_stale, file=sys.stderr)


onstart:
    record_owner()


onsuccess:
    forget_owner()


onerror:
    forget_owner()


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
