#!/usr/bin/env bash
# Sets up everything a fresh machine needs (virtualenv at .venv, pinned dependencies, the default
# model), then either serves or runs the whole test suite.
#   scripts/bootstrap.sh serve [edge-llm serve flags...]
#   scripts/bootstrap.sh test  [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

action="${1:-serve}"
shift || true

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  "$python" -m venv .venv
fi

# Reinstall only when pyproject.toml changed (llama-cpp-python builds from source once, ~8-15 min;
# pip caches the wheel after that).
stamp=".venv/.edge-llm-installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "installing dependencies (the first llama-cpp-python build takes several minutes)" >&2
  .venv/bin/python -m pip install --disable-pip-version-check -q --upgrade "pip==25.3"
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    .venv/bin/python -m pip install --disable-pip-version-check -q -e ".[test]"
  rm -f .venv/.edge-llm-installed-*
  touch "$stamp"
fi

.venv/bin/edge-llm model fetch

case "$action" in
  serve) exec .venv/bin/edge-llm serve "$@" ;;
  test) exec .venv/bin/python -m pytest "$@" ;;
  *) echo "usage: scripts/bootstrap.sh serve|test [args...]" >&2; exit 2 ;;
esac
