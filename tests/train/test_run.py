"""Work directories keyed by settings and input contents (hybridlab.train.run), and the stale-checkpoint
regression: a teacher whose mixture is rebuilt with the same shape retrains instead of resuming.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from hybridlab.errors import HybridlabError
from hybridlab.train import run

pytestmark = pytest.mark.smoke_dag  # one test reads the session's smoke repository (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def _inputs(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "tokens.npy").write_bytes(b"abc")
    (data / "meta.json").write_text("{}")
    (data / ".hidden").write_text("ignored")
    return data


def test_fingerprint_follows_settings_and_every_input_file(tmp_path):
    data = _inputs(tmp_path)
    base = run.fingerprint({"lr": 1e-3}, [data, "org/teacher"])
    assert run.fingerprint({"lr": 1e-3}, [data, "org/teacher"]) == base and len(base) == 16
    assert run.fingerprint({"lr": 3e-4}, [data, "org/teacher"]) != base
    assert run.fingerprint({"lr": 1e-3}, [data, "org/other"]) != base  # a hub id counts by name
    (data / ".hidden").write_text("still ignored")
    assert run.fingerprint({"lr": 1e-3}, [data, "org/teacher"]) == base
    (data / "tokens.npy").write_bytes(b"abd")  # same size, other content
    assert run.fingerprint({"lr": 1e-3}, [data, "org/teacher"]) != base
    (data / "tokens.npy").write_bytes(b"abc")
    assert run.fingerprint({"lr": 1e-3}, [data, "org/teacher"]) == base
    (data / "extra.txt").write_text("")
    assert run.fingerprint({"lr": 1e-3}, [data, "org/teacher"]) != base


def test_large_files_count_by_size_mtime_and_edges(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "FULL_HASH_BYTES", 16)
    monkeypatch.setattr(run, "_EDGE_BYTES", 4)
    big = tmp_path / "big.bin"
    big.write_bytes(b"A" * 40)
    os.utime(big, ns=(10**18, 10**18))
    base = run.fingerprint({}, [big])
    big.write_bytes(b"A" * 18 + b"BB" + b"A" * 20)  # the middle is not read ...
    os.utime(big, ns=(10**18, 10**18))
    assert run.fingerprint({}, [big]) == base
    os.utime(big, ns=(2 * 10**18, 2 * 10**18))  # ... but a rebuilt file has a new mtime
    assert run.fingerprint({}, [big]) != base


def test_work_dir_resumes_identical_inputs_and_starts_fresh_for_changed_ones(tmp_path):
    data = _inputs(tmp_path)
    base = tmp_path / "runs"
    first = run.work_dir(base, {"lr": 1}, [data])
    (first / "checkpoints").mkdir()
    assert run.work_dir(base, {"lr": 1}, [data]) == first and (first / "checkpoints").is_dir()
    assert json.loads((first / run.FINGERPRINT_FILE).read_text())["settings"] == {"lr": 1}
    (data / "tokens.npy").write_bytes(b"xyz")
    second = run.work_dir(base, {"lr": 1}, [data])
    assert second != first and not first.exists() and not (second / "checkpoints").exists()
    (second / "checkpoints").mkdir()
    assert not (run.work_dir(base, {"lr": 1}, [data], restart=True) / "checkpoints").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(HybridlabError, match="is a file"):
        run.work_dir(tmp_path / "file", {}, [data])


def _teacher(mixture, tokenizer, work, out):
    params = {"seed": 0, "name": "teacher",
              "shape": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                        "head_dim": 16, "intermediate_size": 64},
              "train": {"steps": 4, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "eval_every": 2,
                        "ckpt_every": 2, "eval_rows_per_language": 2, "epochs": 10}}
    cmd = [sys.executable, str(ROOT / "workflow_scripts/pretrain_teacher.py"), "--params", json.dumps(params),
           "--mixture", str(mixture), "--tokenizer", str(tokenizer), "--work", str(work), "--out", str(out)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return p.stdout + p.stderr, load_file(out / "model.safetensors")


@pytest.mark.slow
def test_rebuilt_mixture_of_the_same_shape_retrains_the_teacher(smoke_workdir, tmp_path):
    data = smoke_workdir / "results/data/smoke"
    mixture = tmp_path / "mixture"
    shutil.copytree(next((data / "mixture").glob("*/multilingual")), mixture)
    tokenizer = next((data / "tokenizer").iterdir())
    work, out = tmp_path / "work", tmp_path / "out"
    _, first = _teacher(mixture, tokenizer, work, out)
    (old_dir,) = list(work.iterdir())

    # The same command after its output vanished (a killed job): resumes the finished run, trains nothing.
    shutil.rmtree(out)
    log, again = _teacher(mixture, tokenizer, work, out)
    assert list(work.iterdir()) == [old_dir] and "resum" in log.lower()
    assert all((again[k] == first[k]).all() for k in first)

    # The mixture rebuilt with the same shape (rows shifted): a fresh run, not the old checkpoint.
    tokens = np.load(mixture / "tokens.npy")
    np.save(mixture / "tokens.npy", np.roll(tokens, 1, axis=1))
    log, rebuilt = _teacher(mixture, tokenizer, work, out)
    (new_dir,) = list(work.iterdir())
    assert new_dir != old_dir and "resum" not in log.lower()
    assert any(not (rebuilt[k] == first[k]).all() for k in first)


def test_keep_last_k_is_not_part_of_the_fingerprint():
    from hybridlab.train.run import fingerprint

    base = {"seed": 0, "stage2": {"lr": 1e-4}}
    assert fingerprint({**base, "keep_last_k": 1}, []) == fingerprint(base, [])
    assert fingerprint({**base, "stage2": {"lr": 1e-4, "keep_last_k": 3}}, []) == fingerprint(base, [])
    assert fingerprint({**base, "final_checkpoint": "weights"}, []) == fingerprint(base, [])
    assert fingerprint({**base, "seed": 1}, []) != fingerprint(base, [])
