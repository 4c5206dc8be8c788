#!/usr/bin/env bash
# Train the openai-only team of app.py with one command.
#
#   examples/external_agents/run.sh                       # SmolLM2-135M, 3 updates of 48 episodes
#   examples/external_agents/run.sh --set max_steps=2     # extra arguments go to `marti train`
#
# 1. `marti train config.yaml` starts the job; its gateway serves alice's and bob's policies and writes
#    <run_dir>/gateway.json.
# 2. app.py evaluates the untrained team on held-out questions, plays the training episodes (one round per
#    update) and reports their rewards, then evaluates the trained team while the job lingers (gateway.linger_s).
# 3. The job is asked to stop, prints its summary and the final line "trained N steps on M external episodes".
#
# Environment: MARTI=path of the marti command (default: marti on PATH, else python -m marti.command.main),
# PYTHON (default python3), RUN_DIR (default runs/external_agents), CONFIG (default config.yaml here), APP (default
# app.py here: any app with the same flags, as examples/agents_sdk/ and examples/langgraph/ have).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
CONFIG="${CONFIG:-$HERE/config.yaml}"
RUN_DIR="${RUN_DIR:-runs/external_agents}"
APP="${APP:-$HERE/app.py}"
if [ -n "${MARTI:-}" ]; then read -r -a MARTI_CMD <<<"$MARTI"
elif command -v marti >/dev/null; then MARTI_CMD=(marti)
else MARTI_CMD=("$PYTHON" -m marti.command.main); fi

rm -f "$RUN_DIR/gateway.json"
"${MARTI_CMD[@]}" train "$CONFIG" --no-progress --set output.dir="$RUN_DIR" "$@" &
JOB=$!
trap 'kill "$JOB" 2>/dev/null || true' EXIT

for _ in $(seq 1 600); do  # the gateway is up once the job's actors are
  [ -s "$RUN_DIR/gateway.json" ] && break
  kill -0 "$JOB" 2>/dev/null || { wait "$JOB"; exit 1; }
  sleep 1
done
[ -s "$RUN_DIR/gateway.json" ] || { echo "run.sh: no gateway after 600 s" >&2; exit 1; }
read -r URL STEPS PER_STEP GROUP < <("$PYTHON" - "$RUN_DIR" <<'PY'
import json, sys, yaml
run = sys.argv[1]
cfg = yaml.safe_load(open(f"{run}/config.yaml"))
http = json.load(open(f"{run}/gateway.json"))["http"]
print(http, cfg["max_steps"], cfg["external"]["episodes_per_step"], cfg["rollout"]["group_size"])
PY
)
echo "untrained (held-out): $("$PYTHON" "$APP" --gateway "$URL" --evaluate)"
echo "training episodes:    $("$PYTHON" "$APP" --gateway "$URL" --rounds "$STEPS" --episodes-per-round "$PER_STEP" --group-size "$GROUP")"
echo "trained (held-out):   $("$PYTHON" "$APP" --gateway "$URL" --evaluate --wait-version "$STEPS")"
kill -TERM "$JOB"   # ends the linger; the job stops cleanly
trap - EXIT
wait "$JOB"
