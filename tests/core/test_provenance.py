"""Provenance records: config subset + hash + commit + versions, byte-stable across reruns."""

import json
import subprocess
import sys
from pathlib import Path

from hybridlab import provenance
from hybridlab.config import config_hash

ROOT = Path(__file__).resolve().parents[2]


def test_record_for_directory_and_file_is_stable(tmp_path):
    out_dir = tmp_path / "model"
    out_dir.mkdir()
    out_file = tmp_path / "table.parquet"
    out_file.write_bytes(b"x")
    params = {"seed": 3, "placement": "sandwich"}
    p1 = provenance.write(out_dir, params, "x.py", ROOT)
    p2 = provenance.write(out_file, params, "x.py", ROOT)
    assert p1 == out_dir / "provenance.json" and p2 == tmp_path / "table.parquet.provenance.json"
    rec = json.loads(p1.read_text())
    assert rec["params"] == params and rec["config_hash"] == config_hash(params)
    assert rec["packages"]["torch"].startswith("2.") and rec["git_commit"] != ""
    before = p1.read_bytes()
    provenance.write(out_dir, params, "x.py", ROOT)
    assert p1.read_bytes() == before, "no timestamps: a rerun writes identical bytes"


def test_git_commit_outside_a_repository(tmp_path):
    assert provenance.git_commit(tmp_path) == "unknown"


def test_workflow_script_writes_provenance(tmp_path):
    params = {"t": 3, "gaps": [4], "gap_weights": [1], "n_train": 4, "n_val": 2, "n_test": 2, "seed": 1}
    proc = subprocess.run([sys.executable, str(ROOT / "workflow_scripts/make_spaced_retrieval.py"),
                           "--params", json.dumps(params), "--out", str(tmp_path / "sr")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "sr" / "provenance.json").read_text())
    assert rec["script"] == "make_spaced_retrieval.py" and rec["params"] == params
