"""workflow_scripts/_common.py, the glue every workflow script shares: parser, params, threads, errors."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from hybridlab.errors import HybridlabError

ROOT = Path(__file__).resolve().parents[2]
# loaded from its file: the scripts' directory is not put on sys.path (its module names are generic)
_spec = importlib.util.spec_from_file_location("_common", ROOT / "workflow_scripts" / "_common.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)


def test_parser_requires_params_and_shows_description_and_params_epilog_as_written():
    p = _common.parser("Title line.\n\n  indented: kept\n", "--params keys: a, b\n  c: nested")
    with pytest.raises(SystemExit):
        p.parse_args([])
    assert p.parse_args(["--params", "{}"]).params == "{}"
    text = p.format_help()
    assert "  indented: kept" in text and "--params keys: a, b\n  c: nested" in text
    assert "(keys: see below)" in text
    assert "keys: see below" not in _common.parser("No epilog.").format_help()


def test_load_params_accepts_only_a_json_object():
    assert _common.load_params('{"a": 1}') == {"a": 1}
    with pytest.raises(HybridlabError, match=r"not valid JSON .* at char 1"):
        _common.load_params("{oops")
    with pytest.raises(HybridlabError, match="must be a JSON object"):
        _common.load_params("[1, 2]")


def test_set_threads_none_keeps_torchs_choice():
    import torch

    before = torch.get_num_threads()
    _common.set_threads(None)
    assert torch.get_num_threads() == before
    _common.set_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(before)


@pytest.mark.parametrize("script", ["eval_softcka", "eval_niah", "eval_recency", "eval_perplexity",
                                    "eval_position_loss", "eval_retrieval_heads", "eval_retrieval_score",
                                    "make_figure", "pack_mixture", "build_hub_corpus", "build_offline_corpus"])
def test_every_thin_script_documents_its_params_keys_in_help(script):
    proc = subprocess.run([sys.executable, str(ROOT / "workflow_scripts" / f"{script}.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "keys" in proc.stdout.split("options:")[-1]  # the epilog after the options lists the settings
    assert len((ROOT / "workflow_scripts" / f"{script}.py").read_text().splitlines()) <= 60


# not rules: the rehearsal's input writer (`make rehearsal`) and the maintainers' README splicer
NOT_RULES = {"_common", "make_rehearsal_inputs", "readme_findings"}


def test_every_rule_script_is_one_call_of_its_rules_job():
    """A rule's script parses its arguments and calls its rule's job in hybridlab.pipeline.jobs: no other library
    import than that one (its typed section and the errors aside), so the job's steps live in one place."""
    import ast

    scripts = sorted(p for p in (ROOT / "workflow_scripts").glob("*.py") if p.stem not in NOT_RULES)
    assert len(scripts) >= 25
    for path in scripts:
        imports = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)
                   and (n.module or "").startswith("hybridlab")
                   and not n.module.startswith(("hybridlab.config_spec", "hybridlab.errors"))]
        modules = [n.module for n in imports]
        assert len(modules) == 1 and modules[0].startswith("hybridlab.pipeline.jobs"), (path.name, modules)
        assert len(path.read_text().splitlines()) <= 60, path.name
