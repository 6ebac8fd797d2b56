#!/usr/bin/env bash
# Codex CLI and Claude Code end to end against this server (docs/api/agents.md):
#   benchmarks/agent_clis.sh [OUT_DIR]
# Installs the pinned CLIs (benchmarks/agent_clis/package.json, npm), serves the default model with --ctx-size 32768,
# and runs `codex exec` and `claude -p` once each on a small task in a temporary git repository, through
# tests/tools/capture_proxy.py. Prints every request's route and status, each CLI's exit code and answer, and
# leaves the captured requests in OUT_DIR (corpus-shaped: copy the ones worth keeping to tests/fixtures/clients/).
# Minutes on a CPU (first prompts of 6k and 12k tokens): a documented command, not a CI test.
set -euo pipefail
cd "$(dirname "$0")/.."
repo_root=$PWD
out="$(realpath -m "${1:-$(mktemp -d /tmp/agent-clis.XXXXXX)}")"
python="${PYTHON:-$repo_root/.venv/bin/python}"
cli_timeout="${AGENT_CLI_TIMEOUT:-1500}"
model="$("$python" -c 'from edge_llm.testing.server import MODEL_ID; print(MODEL_ID)')"
mkdir -p "$out"

clis=benchmarks/agent_clis
if ! cmp -s "$clis/package.json" "$clis/node_modules/.installed-package.json"; then
  (cd "$clis" && npm install --no-audit --no-fund --no-package-lock --silent >&2)
  cp "$clis/package.json" "$clis/node_modules/.installed-package.json"
fi
codex="$repo_root/$clis/node_modules/@openai/codex/bin/codex.js"
claude="$repo_root/$clis/node_modules/@anthropic-ai/claude-code-linux-x64/claude"

free_port() { "$python" -c 'from edge_llm.testing.server import free_port; print(free_port())'; }
server_port=$(free_port); codex_port=$(free_port); claude_port=$(free_port)
pids=()
# TERM, not INT: a non-interactive shell starts its background jobs with SIGINT ignored
cleanup() { for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

"$python" -m edge_llm serve --ctx-size 32768 --port "$server_port" > "$out/server.log" 2>&1 &
pids+=($!)
for proxy in "codex $codex_port codex-exec 0.171.0" "claude $claude_port claude-p 2.1.332"; do
  read -r name port program version <<< "$proxy"
  "$python" tests/tools/capture_proxy.py --upstream "http://127.0.0.1:$server_port" --port "$port" \
    --out "$out/$name" --program "$program" --version "$version" > "$out/proxy-$name.log" 2>&1 &
  pids+=($!)
done
until curl -sf "http://127.0.0.1:$server_port/readyz" >/dev/null; do sleep 1; done

work="$out/repo"
mkdir -p "$work" && cd "$work"
git init -q
printf 'def add(a, b):\n    return a - b\n' > calc.py
git add calc.py && git -c user.name=bench -c user.email=bench@localhost commit -qm "calc"
task="Fix the bug in calc.py: add should return the sum of a and b."

mkdir -p "$out/codex-home"
cat > "$out/codex-home/config.toml" <<TOML
model = "$model"
model_provider = "edge"
check_for_update_on_startup = false

[model_providers.edge]
name = "Edge LLM Engine"
base_url = "http://127.0.0.1:$codex_port/v1"
wire_api = "responses"
stream_idle_timeout_ms = 1500000

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
TOML
start=$(date +%s)
set +e
CODEX_HOME="$out/codex-home" timeout "$cli_timeout" node "$codex" exec --skip-git-repo-check "$task" \
  < /dev/null > "$out/codex.out" 2> "$out/codex.err"
codex_status=$?
codex_seconds=$(( $(date +%s) - start ))
git checkout -q calc.py
start=$(date +%s)
HOME="$out/claude-home" ANTHROPIC_BASE_URL="http://127.0.0.1:$claude_port" ANTHROPIC_API_KEY=unused \
  ANTHROPIC_MODEL="$model" ANTHROPIC_SMALL_FAST_MODEL="$model" CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 API_TIMEOUT_MS=$(( cli_timeout * 1000 )) \
  timeout "$cli_timeout" "$claude" -p "$task" < /dev/null > "$out/claude.out" 2> "$out/claude.err"
claude_status=$?
claude_seconds=$(( $(date +%s) - start ))
set -e
cd "$repo_root"

report() {  # name, exit status, seconds
  echo "== $1: exit $2 after $3 s; its requests:"
  "$python" - "$out/$1" <<'PY'
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    record = json.loads(path.read_text())
    body = record["body"] if isinstance(record["body"], dict) else {}
    print(f"  {record['method']} {record['path']}{'?' + record['query'] if record['query'] else ''} -> "
          f"{record['status']}  fields: {', '.join(sorted(body))}")
PY
  echo "  answer: $(tail -c 600 "$out/$1.out")"
}
report codex "$codex_status" "$codex_seconds"
report claude "$claude_status" "$claude_seconds"
echo "captured requests, logs and the repository: $out"
[ "$codex_status" -eq 0 ] && [ "$claude_status" -eq 0 ]
