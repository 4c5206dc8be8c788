#!/usr/bin/env bash
# Train the LangGraph team of app.py with one command (the steps of examples/external_agents/run.sh:
# start the job, evaluate the untrained team on held-out questions, play and report the training episodes, evaluate
# the trained team while the job lingers, stop the job; its last line is "trained N steps on M external episodes").
#
#   examples/langgraph/run.sh                       # SmolLM2-135M, 3 updates of 24 episodes
#   examples/langgraph/run.sh --set max_steps=2     # extra arguments go to `marti train`
#
# Environment: as examples/external_agents/run.sh (MARTI, PYTHON, RUN_DIR default runs/langgraph, CONFIG).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export APP="$HERE/app.py" CONFIG="${CONFIG:-$HERE/config.yaml}" RUN_DIR="${RUN_DIR:-runs/langgraph}"
exec "$HERE/../external_agents/run.sh" "$@"
