#!/usr/bin/env bash
# Build the base image marti-base:bookworm without any image registry: debootstrap a minimal Debian bookworm
# root (python3, python3-venv, ca-certificates) from the Debian mirror this machine's apt already uses, then
# `docker import` it. Needs root, debootstrap and a running Docker engine (DOCKER_HOST).
#
# Usage: deploy/make_base_image.sh   (env: BASE_IMAGE, DEBIAN_MIRROR, WORK_DIR, FORCE=1 to rebuild)
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-marti-base:bookworm}"
WORK_DIR="${WORK_DIR:-/var/tmp/marti-deploy}"
DOCKER="${DOCKER:-docker}"

log() { printf '[make_base_image %(%H:%M:%S)T] %s\n' -1 "$*"; }

if [[ "${FORCE:-0}" != "1" ]] && "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  log "$BASE_IMAGE already exists (FORCE=1 rebuilds it)"
  exit 0
fi
if [[ -z "${DEBIAN_MIRROR:-}" ]]; then
  # The first Debian mirror apt is configured with (deb822 .sources or one-line sources.list).
  DEBIAN_MIRROR="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
  [[ -n "$DEBIAN_MIRROR" ]] || DEBIAN_MIRROR="$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
fi
if [[ -z "$DEBIAN_MIRROR" ]]; then
  echo "make_base_image: no Debian mirror found in apt's sources; set DEBIAN_MIRROR" >&2
  exit 2
fi
command -v debootstrap >/dev/null || { echo "make_base_image: debootstrap missing (apt-get install debootstrap)" >&2; exit 2; }

ROOTFS="$WORK_DIR/rootfs-bookworm"
mkdir -p "$WORK_DIR"
if [[ ! -x "$ROOTFS/usr/bin/python3" ]]; then
  rm -rf "$ROOTFS"
  log "debootstrap bookworm (minbase + python3, python3-venv, ca-certificates) into $ROOTFS"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOTFS" "$DEBIAN_MIRROR" \
    > "$WORK_DIR/debootstrap.log" 2>&1 || { tail -20 "$WORK_DIR/debootstrap.log" >&2; exit 1; }
fi
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
log "docker import -> $BASE_IMAGE"
tar -C "$ROOTFS" -c . | "$DOCKER" import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
"$DOCKER" run --rm --network host "$BASE_IMAGE" python3 -c 'import sys, venv, ssl; print("base python", sys.version.split()[0])'
