#!/usr/bin/env bash
# Bootstrap a Debian root filesystem from Debian's packages and import it as a local
# Docker image. No container registry is needed (none is reachable on kooi's build
# machines); the resulting image id is what kooi pins, like a registry digest.
#
# usage: build.sh SUITE TAG [--include pkg,pkg] [--variant minbase] [--setup SCRIPT]
#        [--change 'DOCKERFILE INSTR']... [--ca-dir DIR] [--mirror URL]
#   --change INSTR  a Dockerfile instruction applied on top of the imported root
#                   filesystem (any instruction: docker build --network none)
#   --setup SCRIPT  runs inside the chroot (as /kooi-setup.sh) before the import
#   --ca-dir DIR    extra CA certificates (*.crt) to trust (default: the host's
#                   /usr/local/share/ca-certificates, which corporate TLS interception needs)
# Prints the image id on the last line of stdout.
set -euo pipefail

suite=${1:?suite (bookworm, trixie)}; tag=${2:?image tag}; shift 2
include="ca-certificates"; variant=minbase; setup=""; changes=(); cadir=/usr/local/share/ca-certificates
mirror=${KOOI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
while [ $# -gt 0 ]; do
  case "$1" in
    --include) include="$include,$2"; shift 2 ;;
    --variant) variant=$2; shift 2 ;;
    --setup) setup=$2; shift 2 ;;
    --change) changes+=("$2"); shift 2 ;;
    --ca-dir) cadir=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    *) echo "build.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
for tool in debootstrap docker; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is required (apt-get install $tool)" >&2; exit 3; }
done

work=$(mktemp -d /var/tmp/kooi-rootfs.XXXXXX)
cleanup() { umount -R "$work/rootfs/proc" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
root="$work/rootfs"

debootstrap --variant="$variant" --include="$include" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2; echo "build.sh: debootstrap $suite failed" >&2; exit 1; }

# Trust the operator's extra CAs (TLS interception on corporate networks and here).
if [ -d "$cadir" ] && ls "$cadir"/*.crt >/dev/null 2>&1; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp "$cadir"/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
fi

cat >"$root/etc/apt/sources.list" <<SRC
deb $mirror $suite main
deb $mirror $suite-updates main
SRC
rm -f "$root/etc/apt/sources.list.d/"*.sources 2>/dev/null || true
# Keep images small and reproducible-ish: no docs, no apt lists, fixed hostname files.
printf 'path-exclude /usr/share/doc/*\npath-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n' \
  >"$root/etc/dpkg/dpkg.cfg.d/01-kooi-nodoc"
if [ -n "$setup" ]; then
  install -m 0755 "$setup" "$root/kooi-setup.sh"
  mount -t proc proc "$root/proc"
  chroot "$root" /kooi-setup.sh
  umount "$root/proc"
  rm -f "$root/kooi-setup.sh"
fi
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
# No package lists in the image: make them look stale, so the first apt run updates.
touch -d 2000-01-01 "$root/var/lib/apt/lists"
: >"$root/etc/machine-id"

if [ ${#changes[@]} -eq 0 ]; then
  tar --numeric-owner --xattrs --xattrs-include='*' -C "$root" -c . | docker import - "$tag" >/dev/null
else
  # docker import accepts only some instructions (no STOPSIGNAL): build a layer-free
  # image on top instead, without network.
  tar --numeric-owner --xattrs --xattrs-include='*' -C "$root" -c . | docker import - "$tag-rootfs" >/dev/null
  mkdir -p "$work/ctx"
  { echo "FROM $tag-rootfs"; printf '%s\n' "${changes[@]}"; } >"$work/ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build --network none -q -t "$tag" "$work/ctx" >/dev/null
  docker rmi "$tag-rootfs" >/dev/null
fi
docker image inspect --format '{{.Id}}' "$tag"
