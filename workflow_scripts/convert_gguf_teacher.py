"""A GGUF teacher: convert the file once into a from_pretrained model directory (weights, config, tokenizer
with its chat template, gguf.json with the file's sha256) that every later job reads
(`hybridlab.models.gguf.convert_gguf`)."""

import json

import _common

PARAMS = """--params keys: gguf (a .gguf path, or package:<package>/<file> for a file an installed package ships),
name (the teacher's name in the config)"""


def main() -> None:
    p = _common.parser(__doc__, PARAMS)
    for name in ("--mixture", "--tokenizer", "--work"):
        p.add_argument(name, help="unused for GGUF teachers (accepted so every teacher script shares a rule)")
    p.add_argument("--out", required=True, help="the model directory")
    args = p.parse_args()
    params = _common.load_params(args.params)

    from hybridlab.models.gguf import convert_gguf

    record = convert_gguf(params["gguf"], args.out)
    print(f"converted {params['name']} from {record['file']} -> {args.out}: {json.dumps(record, sort_keys=True)}")


if __name__ == "__main__":
    _common.run(main)
