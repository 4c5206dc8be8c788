#!/usr/bin/env bash
# Train the OpenAI Agents SDK team of app.py with one command (the steps of examples/external_agents/run.sh:
# start the job, evaluate the untrained team on held-out questions, play and report the training episodes, evaluate
# the trained team while the job lingers, stop the job; its last line is "trained N steps on M external episodes").
#
#   examples/agents_sdk/run.sh                       # SmolLM2-135M, 3 updates of 24 episodes
#   examples/agents_sdk/run.sh --set max_steps=2     # extra arguments go to `marti train`
#
# Environment: as examples/external_agents/run.sh (MARTI, PYTHON, RUN_DIR default runs/agents_sdk, CONFIG).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export APP="$HERE/app.py" CONFIG="${CONFIG:-$HERE/config.yaml}" RUN_DIR="${RUN_DIR:-runs/agents_sdk}"
exec "$HERE/../external_agents/run.sh" "$@"
