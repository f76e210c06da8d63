"""The models phase's jobs: a hub or GGUF teacher saved as a local model directory, and a dense teacher converted
into a hybrid at one placement. One function per rule, called by its thin workflow script."""

from __future__ import annotations

from pathlib import Path

from hybridlab.config_spec import ConvertJob, TeacherJob, job_settings
from hybridlab.errors import HybridlabError


def fetch_teacher_job(params: TeacherJob | dict, *, out: str | Path) -> None:
    """The hub teacher `name` (or a local path; `hybridlab.models.registry`) with its tokenizer saved as a
    from_pretrained directory at `out`, replaced atomically: later rules read it, so the hub is read once."""
    from hybridlab.atomic import atomic_dir
    from hybridlab.models.registry import load_causal_lm, load_tokenizer_for

    job = job_settings(TeacherJob, params, "fetch_teacher.py")
    model = load_causal_lm(job.name)
    with atomic_dir(Path(out)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size="100GB")
        load_tokenizer_for(job.name).save_pretrained(tmp)


def gguf_teacher_job(params: TeacherJob | dict, *, out: str | Path) -> dict:
    """The teacher's GGUF file (`gguf`) converted once into a model directory at `out`
    (`hybridlab.models.gguf.convert_gguf`); returns its record (file, sha256, ...)."""
    from hybridlab.models.gguf import convert_gguf

    job = job_settings(TeacherJob, params, "convert_gguf_teacher.py")
    if not job.gguf:
        raise HybridlabError("convert_gguf_teacher.py: --params has no gguf; name the teacher's file in models.gguf")
    return convert_gguf(job.gguf, out)


def convert_student_job(params: ConvertJob | dict, *, teacher: str | Path, out: str | Path,
                        importance: str | Path | None = None) -> str:
    """Convert `teacher` at the job's placement and save the student to `out` (`save_hybrid`); returns a one-line
    summary (FA layers, diagram, parameters added, conv init).

    The loaded teacher is converted in place (one model in memory). A searched placement (`searched`,
    `searched_<group>`) keeps the FA layers with the highest importance of its language group in `importance`
    (the layer importance table) and records the scores in hybrid.json; `all_mixers` converts every layer.
    """
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.io import save_hybrid
    from hybridlab.models.placements import fa_layers, num_fa_layers, placement_diagram, searched_group
    from hybridlab.models.registry import load_causal_lm

    job = job_settings(ConvertJob, params, "convert_student.py")
    group = searched_group(job.placement)
    if group is not None and not importance:
        raise HybridlabError(f"placement {job.placement} is chosen from layer importance; pass --importance")
    model = load_causal_lm(str(teacher))
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    extra = {"placement": job.placement, "fa_ratio": job.fa_ratio, "teacher": str(teacher)}
    if group is not None:
        import polars as pl

        from hybridlab.eval.layer_importance import searched_layers

        fa, kl = searched_layers(pl.read_parquet(importance), group, n_layers, num_fa_layers(n_layers, job.fa_ratio))
        extra["search"] = {"group": group, "score": "kl", "kl_by_layer": kl, "importance": str(importance)}
    else:
        fa = fa_layers(job.placement, n_layers, ratio=job.fa_ratio)
    n_teacher = sum(p.numel() for p in model.parameters())
    student = convert_to_hybrid(model, fa, job.mixer, seed=job.seed, conv_init=job.conv_init, inplace=True)
    del model
    student.hybridlab_spec.extra = extra
    save_hybrid(student, out)
    types = ["full_attention" if i in fa else job.mixer for i in range(n_layers)]
    n_new = sum(p.numel() for p in student.parameters()) - n_teacher
    return (f"{job.placement} ({job.mixer}): FA layers {fa}  {placement_diagram(types)}  "
            f"{n_new:+d} parameters vs teacher, conv_init {job.conv_init}")
