#!/usr/bin/env bash
# Bring the containerised marti stack up for real, end to end, on a machine with no running Docker engine and
# no reachable image registry (the project's CI machines), then take it down again:
#
#   1. start dockerd by hand (state under $WORK_DIR, --bridge=none, --iptables=false) unless one answers
#   2. build the offline wheelhouse (deploy/make_wheelhouse.sh) if missing
#   3. build the base image from a debootstrapped Debian root (deploy/make_base_image.sh) if missing
#   4. docker-compose build (services + trainer images), host networking (docker-compose.host.yml)
#   5. docker-compose up -d; wait until every container's health check (marti health) says healthy
#   6. `marti health 127.0.0.1:PORT` for each service from the host
#   7. submit a tiny training job to the trainer (Ray head inside the container; RUN_JOB=0 skips it)
#   8. docker-compose down (-v unless KEEP_VOLUMES=1), stop the dockerd this script started
#   9. remove what this run created: deploy/wheelhouse if it built it (~470 MB) and WORK_DIR if it created it
#      (engine state: images, layers, the base image's root; ~4.5 GB); --keep or KEEP_STATE=1 keeps them for the
#      next run. A wheelhouse or WORK_DIR that was there before is left as it was.
#
# Usage (root): deploy/bring_up.sh [--keep]
#        deploy/bring_up.sh --clean-only PATH...   (remove PATHs the way step 9 does, through the same exit trap)
# Env: WORK_DIR (/var/tmp/marti-deploy), MARTI_BROKER_PORT..MARTI_TRAINER_PORT (50051-50054), MARTI_RAY_PORT,
#      RUN_JOB (1), JOB_TIMEOUT_S (600), HEALTH_TIMEOUT_S (300), KEEP_VOLUMES (0), KEEP_STATE (0),
#      PYTHON (repo .venv python).
# Prints the seconds each phase took; exits non-zero at the first failure (after cleaning up).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPLOY="$ROOT/deploy"
WORK_DIR="${WORK_DIR:-/var/tmp/marti-deploy}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
DOCKER="${DOCKER:-/usr/bin/docker}"
export DOCKER DOCKER_HOST="${DOCKER_HOST:-unix://$WORK_DIR/docker.sock}"
export MARTI_BROKER_PORT="${MARTI_BROKER_PORT:-50051}" MARTI_ENV_PORT="${MARTI_ENV_PORT:-50052}"
export MARTI_STORE_PORT="${MARTI_STORE_PORT:-50053}" MARTI_TRAINER_PORT="${MARTI_TRAINER_PORT:-50054}"
export MARTI_RAY_PORT="${MARTI_RAY_PORT:-6379}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-300}"
JOB_TIMEOUT_S="${JOB_TIMEOUT_S:-600}"
PROJECT=marti
COMPOSE=(docker-compose -p "$PROJECT" -f "$DEPLOY/docker-compose.yml" -f "$DEPLOY/docker-compose.host.yml")
SERVICES=(broker env-server store trainer)
PORTS=("$MARTI_BROKER_PORT" "$MARTI_ENV_PORT" "$MARTI_STORE_PORT" "$MARTI_TRAINER_PORT")

T0=$SECONDS
PHASE_START=$SECONDS
STARTED_DOCKERD=0
COMPOSE_UP=0
KEEP_STATE="${KEEP_STATE:-0}"
CREATED=()  # folders this run created, removed on exit unless KEEP_STATE=1
CLEAN_ONLY=0
while (($#)); do
  case "$1" in
    --keep) KEEP_STATE=1 ;;
    --clean-only) CLEAN_ONLY=1; shift; CREATED=("$@"); break ;;
    *) echo "bring_up: unknown argument $1 (usage: bring_up.sh [--keep] | --clean-only PATH...)" >&2; exit 2 ;;
  esac
  shift
done
log() { printf '[bring_up %(%H:%M:%S)T +%4ds] %s\n' -1 "$((SECONDS - T0))" "$*"; }
phase_done() { log "phase done: $1 ($((SECONDS - PHASE_START)) s)"; PHASE_START=$SECONDS; }

cleanup() {
  local rc=$?
  if [[ $COMPOSE_UP == 1 ]]; then
    if [[ $rc != 0 ]]; then "${COMPOSE[@]}" logs --tail 40 2>&1 | tail -120 || true; fi
    log "docker-compose down"
    if [[ "${KEEP_VOLUMES:-0}" == 1 ]]; then "${COMPOSE[@]}" down || true; else "${COMPOSE[@]}" down -v || true; fi
  fi
  if [[ $STARTED_DOCKERD == 1 && -f "$WORK_DIR/dockerd.pid" ]]; then
    local pid
    pid="$(cat "$WORK_DIR/dockerd.pid")"
    log "stopping dockerd (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    # dockerd leaves its default network namespace mounted under the exec root.
    umount "$WORK_DIR/docker-exec/netns/default" 2>/dev/null || true
  fi
  remove_created
  log "exit $rc after $((SECONDS - T0)) s"
}

# Remove the folders in CREATED (the wheelhouse and WORK_DIR this run created), unless KEEP_STATE=1.
remove_created() {
  local path
  for path in "${CREATED[@]}"; do
    if [[ "$KEEP_STATE" == 1 ]]; then log "kept $path (--keep / KEEP_STATE=1)"; continue; fi
    case "$(realpath -m -- "$path")" in /|"$ROOT"|"$DEPLOY") log "not removing $path"; continue ;; esac
    log "removing $path ($(du -sh -- "$path" 2>/dev/null | cut -f1) )"
    rm -rf -- "$path" || log "could not remove all of $path (busy mounts?); remove it by hand"
  done
}
trap cleanup EXIT
[[ $CLEAN_ONLY == 1 ]] && exit 0  # the trap removes CREATED

# ---- 1. Docker engine -------------------------------------------------------------------------------------
for cmd in dockerd docker-compose "$DOCKER"; do
  command -v "$cmd" >/dev/null || { echo "bring_up: $cmd missing (apt-get install docker.io docker-compose)" >&2; exit 2; }
done
if ! "$DOCKER" version >/dev/null 2>&1; then
  [[ -e "$WORK_DIR" ]] || CREATED+=("$WORK_DIR")
  mkdir -p "$WORK_DIR"
  log "starting dockerd (data root $WORK_DIR/docker-data, --bridge=none, --iptables=false)"
  dockerd --data-root "$WORK_DIR/docker-data" --exec-root "$WORK_DIR/docker-exec" --pidfile "$WORK_DIR/dockerd.pid" \
    -H "$DOCKER_HOST" --bridge=none --iptables=false --ip6tables=false >"$WORK_DIR/dockerd.log" 2>&1 &
  STARTED_DOCKERD=1
  for _ in $(seq 1 60); do "$DOCKER" version >/dev/null 2>&1 && break; sleep 0.5; done
  "$DOCKER" version >/dev/null 2>&1 || { tail -20 "$WORK_DIR/dockerd.log" >&2; echo "bring_up: dockerd did not start" >&2; exit 1; }
fi
log "engine: $("$DOCKER" version --format 'server {{.Server.Version}}, storage' 2>/dev/null) $("$DOCKER" info --format '{{.Driver}}')"
phase_done "docker engine"

for i in "${!SERVICES[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/${PORTS[$i]}") 2>/dev/null; then
    echo "bring_up: port ${PORTS[$i]} (${SERVICES[$i]}) is already in use on this host; set MARTI_*_PORT" >&2
    exit 2
  fi
done

# ---- 2-3. wheelhouse and base image -----------------------------------------------------------------------
if [[ "${REBUILD_WHEELHOUSE:-0}" == 1 ]] || ! ls "$DEPLOY"/wheelhouse/base/marti_agent-*.whl >/dev/null 2>&1 \
   || ! ls "$DEPLOY"/wheelhouse/trainer/torch-*.whl >/dev/null 2>&1; then
  CREATED+=("$DEPLOY/wheelhouse")
  PYTHON="$PYTHON" "$DEPLOY/make_wheelhouse.sh"
fi
phase_done "wheelhouse"
[[ -e "$WORK_DIR" ]] || CREATED+=("$WORK_DIR")  # the base image's root goes there
WORK_DIR="$WORK_DIR" "$DEPLOY/make_base_image.sh"
phase_done "base image"

# ---- 4. images ------------------------------------------------------------------------------------------
log "docker-compose build"
"${COMPOSE[@]}" build 2>&1 | grep -E '^(Step [0-9]+/|Successfully|Building)' | grep -vE '^Step [0-9]+/[0-9]+ : (ENV|ARG|WORKDIR|USER|CMD|ENTRYPOINT)' || true
for image in marti-services marti-trainer; do
  log "image $image: $("$DOCKER" image inspect --format '{{.Size}}' "$image:${MARTI_IMAGE_TAG:-0.1.0}" | awk '{printf "%.0f MB", $1/1e6}')"
done
phase_done "images"

# ---- 5. up and healthy ------------------------------------------------------------------------------------
COMPOSE_UP=1
"${COMPOSE[@]}" up -d
deadline=$((SECONDS + HEALTH_TIMEOUT_S))
while :; do
  states=()
  for svc in "${SERVICES[@]}"; do
    cid="$("${COMPOSE[@]}" ps -q "$svc")"
    states+=("$svc=$("$DOCKER" inspect --format '{{.State.Health.Status}}' "$cid")")
  done
  if [[ "${states[*]}" != *starting* && "${states[*]}" != *unhealthy* ]]; then break; fi
  if ((SECONDS > deadline)); then echo "bring_up: not healthy within ${HEALTH_TIMEOUT_S}s: ${states[*]}" >&2; exit 1; fi
  sleep 2
done
log "health: ${states[*]}"
phase_done "compose up until all healthy"

# ---- 6. marti health from the host ------------------------------------------------------------------------
for i in "${!SERVICES[@]}"; do
  status="$("$PYTHON" -m marti.command.main health "127.0.0.1:${PORTS[$i]}" || true)"
  log "marti health 127.0.0.1:${PORTS[$i]} (${SERVICES[$i]}): $status"
  [[ "$status" == SERVING ]] || exit 1
done
phase_done "marti health from the host"

# ---- 7. a tiny job through the containerised trainer --------------------------------------------------
if [[ "${RUN_JOB:-1}" == 1 ]]; then
  log "submitting examples/tiny.yaml to the trainer (ray.address=auto: the Ray head in the trainer container)"
  if ! (cd "$ROOT" && "$PYTHON" deploy/submit_job.py "127.0.0.1:$MARTI_TRAINER_PORT" examples/tiny.yaml \
    --set ray.address=auto --timeout-s "$JOB_TIMEOUT_S"); then
    log "job failed; Ray worker logs of the trainer container follow"
    "${COMPOSE[@]}" exec -T trainer sh -c 'tail -n 40 /tmp/ray-head/session_latest/logs/worker-*.err \
      /tmp/ray-head/session_latest/logs/raylet.out' 2>&1 | tail -150 || true
    exit 1
  fi
  "${COMPOSE[@]}" exec -T trainer sh -c 'ls runs/tiny && ray status --address "127.0.0.1:$MARTI_RAY_PORT" | sed -n "/^Resources/,/^Pending Demands/p"'
  "${COMPOSE[@]}" exec -T broker sh -c 'ls -l /data/broker'
  "${COMPOSE[@]}" exec -T store sh -c 'ls -l /data/store'
  phase_done "tiny training job"
fi
log "all services healthy and answering; taking the stack down"
