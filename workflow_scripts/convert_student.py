"""Convert a dense teacher into a hybrid: full attention at the placement's layers, a mixer elsewhere.

The student inherits q/k/v/o from the teacher's attention (GQA k/v heads repeated); new mixer
parameters are initialised as fla does, seeded; the loaded teacher is converted in place (one model in
memory); `conv_init` ("identity", the default, or
"random") chooses the q/k/v short convolutions' kernel (hybridlab.models.convert). Written with
`save_hybrid` (config.json of the base model + model.safetensors + hybrid.json), loadable with
`hybridlab.models.io.load_hybrid`. A searched placement (`searched`, `searched_<group>`) keeps the FA layers
with the highest importance of its language group in `--importance` (eval_layer_importance.py) and records
the scores in hybrid.json; `all_mixers` converts every layer (the importance pass's student).
"""

import _common


def main() -> None:
    from hybridlab.config_spec import ConvertJob

    p = _common.parser(__doc__, ConvertJob)
    p.add_argument("--teacher", required=True, help="teacher model directory (from_pretrained layout)")
    p.add_argument("--out", required=True, help="student directory")
    p.add_argument("--importance", help="a searched placement: the layer importance table (.parquet)")
    args = p.parse_args()
    job = _common.load_job(ConvertJob, args.params)

    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.io import save_hybrid
    from hybridlab.errors import HybridlabError
    from hybridlab.models.placements import fa_layers, num_fa_layers, placement_diagram, searched_group
    from hybridlab.models.registry import load_causal_lm

    teacher = load_causal_lm(args.teacher)
    n_layers = teacher.config.get_text_config(decoder=True).num_hidden_layers
    group = searched_group(job.placement)
    extra = {"placement": job.placement, "fa_ratio": job.fa_ratio, "teacher": args.teacher}
    if group is not None:
        if not args.importance:
            raise HybridlabError(f"placement {job.placement} is chosen from layer importance; pass --importance")
        import polars as pl

        from hybridlab.eval.layer_importance import searched_layers

        fa, kl = searched_layers(pl.read_parquet(args.importance), group, n_layers, num_fa_layers(n_layers, job.fa_ratio))
        extra["search"] = {"group": group, "score": "kl", "kl_by_layer": kl, "importance": args.importance}
    else:
        fa = fa_layers(job.placement, n_layers, ratio=job.fa_ratio)
    n_teacher = sum(p.numel() for p in teacher.parameters())
    # in place: the loaded teacher becomes the student (no second full copy in host memory)
    student = convert_to_hybrid(teacher, fa, job.mixer, seed=job.seed, conv_init=job.conv_init, inplace=True)
    del teacher
    student.hybridlab_spec.extra = extra
    save_hybrid(student, args.out)
    types = ["full_attention" if i in fa else job.mixer for i in range(n_layers)]
    n_new = sum(p.numel() for p in student.parameters()) - n_teacher
    print(f"{job.placement} ({job.mixer}): FA layers {fa}  {placement_diagram(types)}  "
          f"{n_new:+d} parameters vs teacher, conv_init {job.conv_init}")


if __name__ == "__main__":
    _common.run(main)
