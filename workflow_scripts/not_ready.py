"""Fail a rule whose implementation has not landed yet, with one clear line (never a fake artifact).

Usage: not_ready.py RULE WHAT ISSUE
"""

import sys

if len(sys.argv) != 4:
    print("usage: not_ready.py RULE WHAT ISSUE", file=sys.stderr)
    sys.exit(2)
rule, what, issue = sys.argv[1:]
print(f"error: rule '{rule}' ({what}) is not implemented yet (tracked in issue #{issue}); "
      f"build an earlier phase target instead, e.g. `snakemake data`", file=sys.stderr)
sys.exit(1)
