"""Project task configs for lm-eval (YAML, lm-eval's task format) and the functions they call.

`TASKS_DIR` is handed to lm-eval's `TaskManager(include_path=...)`; see `hybridlab.eval.lm_eval`.
"""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent
