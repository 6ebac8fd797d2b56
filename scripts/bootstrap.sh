#!/usr/bin/env bash
# Sets up everything a fresh machine needs, then serves or runs the test suite:
#   scripts/bootstrap.sh serve [edge-llm serve flags...]
#   scripts/bootstrap.sh test  [pytest args...]
# 1. Debian packages that are missing (python3 with venv, a C/C++ toolchain, and for `test` the
#    chromium the browser test drives, the nginx the load-balancer test runs and the node and npm the Ollama
#    JavaScript client test runs): installed with apt-get when running as root, otherwise the apt-get command to
#    run is printed and the script exits 1.
# 2. The virtualenv .venv with the pinned dependencies, those of the tests and of the docs site included
#    (llama-cpp-python is built from source).
# 3. The default model, in the per-user data directory (`edge-llm model fetch`; idempotent); for `test` also
#    gemma-3-270m, the second catalogued model, and the pinned ollama npm package (tests/integration/ollama_js).
set -euo pipefail
cd "$(dirname "$0")/.."

action="${1:-serve}"
shift || true
case "$action" in
  serve | test) ;;
  *) echo "usage: scripts/bootstrap.sh serve|test [args...]" >&2; exit 2 ;;
esac

python="${PYTHON:-python3}"
chromium="${EDGE_LLM_TEST_CHROMIUM:-/usr/bin/chromium}"
nginx="${EDGE_LLM_TEST_NGINX:-/usr/sbin/nginx}"

missing_packages() {
  local packages=()
  if ! command -v "$python" >/dev/null; then
    packages+=(python3 python3-venv)
  elif ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then  # Debian ships ensurepip in python3-venv
    packages+=(python3-venv)
  fi
  for tool in cc c++ make; do
    command -v "$tool" >/dev/null || { packages+=(build-essential); break; }
  done
  if [ "$action" = test ] && [ ! -x "$chromium" ]; then
    packages+=(chromium)
  fi
  if [ "$action" = test ] && [ ! -x "$nginx" ]; then
    packages+=(nginx)
  fi
  if [ "$action" = test ] && ! command -v npm >/dev/null; then
    packages+=(nodejs npm)
  fi
  echo "${packages[@]}"
}

read -r -a packages <<< "$(missing_packages)"
if [ "${#packages[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian packages: ${packages[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
    read -r -a packages <<< "$(missing_packages)"
  fi
  if [ "${#packages[@]}" -gt 0 ]; then
    echo "bootstrap: missing ${packages[*]}; install with: sudo apt-get install -y --no-install-recommends ${packages[*]}" >&2
    exit 1
  fi
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "bootstrap: $("$python" --version 2>&1) is too old; Python 3.10 or newer is needed (set PYTHON=python3.x)" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  "$python" -m venv .venv
fi

# llama.cpp is built for this CPU (-march=native) but without its AMX kernels: on CPUs that report AMX they are
# compiled in, and on some hosts (a Firecracker VM here) their first `ldtilecfg` takes a general protection fault
# that kills the process at the first matrix multiplication (llama-server built natively from the same source
# crashes alike). The wheel is kept in a cache of its own, keyed by the pin and these flags, because pip's wheel
# cache does not know build flags.
llama_flags="-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__"
llama_pin=$(grep -o '"llama-cpp-python==[^"]*"' pyproject.toml | tr -d '"')
llama_key=$(printf '%s %s' "$llama_pin" "$llama_flags" | sha256sum | cut -c1-16)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/edge-llm/wheels/$llama_key"

# Reinstall only when pyproject.toml or the llama.cpp build changed (llama-cpp-python builds from source once,
# 4-15 min on 2 cores; the wheel is reused after that).
stamp=".venv/.edge-llm-installed-$(sha256sum pyproject.toml | cut -c1-16)-$llama_key"
if [ ! -f "$stamp" ]; then
  echo "installing dependencies (the first llama-cpp-python build takes several minutes)" >&2
  .venv/bin/python -m pip install --disable-pip-version-check -q --upgrade "pip==25.3"
  if ! compgen -G "$wheels/llama_cpp_python-*.whl" >/dev/null; then
    CFLAGS="$llama_flags" CXXFLAGS="$llama_flags" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
      .venv/bin/python -m pip wheel --disable-pip-version-check -q --no-deps --no-cache-dir \
      --no-binary llama-cpp-python "$llama_pin" -w "$wheels"
  fi
  .venv/bin/python -m pip install --disable-pip-version-check -q --no-deps --force-reinstall \
    "$wheels"/llama_cpp_python-*.whl
  .venv/bin/python -m pip install --disable-pip-version-check -q -e ".[test,docs]"
  rm -f .venv/.edge-llm-installed-*
  touch "$stamp"
fi

.venv/bin/edge-llm model fetch
if [ "$action" = test ]; then
  .venv/bin/edge-llm model fetch gemma-3-270m  # the second model, for the tests of a server with several models
  # The official ollama JavaScript client, pinned in its package.json, for the Ollama API tests; reinstalled only
  # when that file changes.
  ollama_js=tests/integration/ollama_js
  if ! cmp -s "$ollama_js/package.json" "$ollama_js/node_modules/.installed-package.json"; then
    echo "installing the ollama JavaScript client for the tests" >&2
    (cd "$ollama_js" && npm install --no-audit --no-fund --no-package-lock --silent >&2)
    cp "$ollama_js/package.json" "$ollama_js/node_modules/.installed-package.json"
  fi
fi

case "$action" in
  serve) exec .venv/bin/edge-llm serve "$@" ;;
  # Two pytest-xdist workers, whole files to each (a file's module servers stay in one worker); `-n 0` after
  # `test` runs the suite in one process. Files go longest first (tests/file_order.py), not by xdist's test count.
  test) exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@" ;;
esac
