#!/bin/sh
# Entrypoint of the trainer image: start a Ray head node inside the container, then run `marti trainer "$@"`.
#
# Environment:
#   MARTI_RAY_HEAD       1 (default) starts the head; 0 skips it (jobs then start a local Ray per job).
#   MARTI_RAY_PORT       GCS port of the head (default 6379); other nodes join with `ray start --address HOST:PORT`.
#   MARTI_RAY_NUM_CPUS   CPUs the head offers (default: all the container sees).
#   MARTI_RAY_OBJECT_STORE_BYTES  object store size in bytes (default: Ray's choice).
#
# The head keeps its session files under /tmp/ray-head, not Ray's default /tmp/ray, so a job whose config
# leaves `ray.address` null still starts its own local Ray (as outside a container); a job with
# `ray.address: auto` finds and uses this head.
set -eu

if [ "${MARTI_RAY_HEAD:-1}" = "1" ]; then
  ray_args="--head --port=${MARTI_RAY_PORT:-6379} --temp-dir=/tmp/ray-head --include-dashboard=false --disable-usage-stats"
  if [ -n "${MARTI_RAY_NUM_CPUS:-}" ]; then ray_args="$ray_args --num-cpus=${MARTI_RAY_NUM_CPUS}"; fi
  if [ -n "${MARTI_RAY_OBJECT_STORE_BYTES:-}" ]; then
    ray_args="$ray_args --object-store-memory=${MARTI_RAY_OBJECT_STORE_BYTES}"
  fi
  # shellcheck disable=SC2086
  ray start $ray_args
fi
exec marti trainer "$@"
