#!/usr/bin/env bash
# Mutation testing of the pure core (docs/mutation.md). Opt-in, slow (minutes per module on a shared 2-core
# machine), never part of CI. Modules and the unit tests that drive them: [tool.mutmut] in pyproject.toml.
#   bash scripts/mutation.sh                                   # every module
#   bash scripts/mutation.sh 'edge_llm.registry.keep_alive*'   # some modules (mutmut's mutant-name globs)
# Then `mutmut results` lists the survivors and `mutmut show NAME` shows one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
# mutmut runs from its copy in mutants/: sources from a PYTHONPATH would shadow the mutated ones.
export PYTHONPATH=
exec nice -n 19 "$PYTHON" -m mutmut run --max-children 1 "$@"
