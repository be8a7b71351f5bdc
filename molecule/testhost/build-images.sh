#!/usr/bin/env bash
# Build the local images the Molecule scenarios need (no registry is reachable):
#   kooi-testhost:debian12, kooi-testhost:debian13  systemd test hosts
#   kooi-probe:latest                                busybox-only image for engine probes
# and save the probe image to $KOOI_IMAGE_DIR/probe.tar for loading inside test hosts.
# Images that already exist are kept unless KOOI_REBUILD=1. --probe-only: just the probe
# image (what `kooi verify` on a host needs; the quick start uses it).
set -euo pipefail
probe_only=0
[ "${1:-}" = --probe-only ] && probe_only=1
here=$(cd "$(dirname "$0")" && pwd)
base="$here/../../images/base/build.sh"
out=${KOOI_IMAGE_DIR:-/var/tmp/kooi-images}
mkdir -p "$out"
have() { [ "${KOOI_REBUILD:-0}" != 1 ] && docker image inspect "$1" >/dev/null 2>&1; }

pkgs=systemd,systemd-sysv,dbus,python3,python3-apt,sudo,iproute2,procps,gnupg
changes=(--change 'ENV container=docker' --change 'STOPSIGNAL SIGRTMIN+3'
         --change 'CMD ["/lib/systemd/systemd"]')
declare -A suites=([debian12]=bookworm [debian13]=trixie)
for name in debian12 debian13; do
  [ "$probe_only" = 0 ] || break
  if have "kooi-testhost:$name"; then echo "kooi-testhost:$name present"; continue; fi
  echo "building kooi-testhost:$name (${suites[$name]})"
  "$base" "${suites[$name]}" "kooi-testhost:$name" --include "$pkgs" \
    --setup "$here/setup-testhost.sh" "${changes[@]}"
done

if ! have kooi-probe:latest; then
  command -v busybox >/dev/null || { echo "busybox (package busybox-static) is required" >&2; exit 3; }
  tmp=$(mktemp -d /var/tmp/kooi-probe.XXXXXX)
  mkdir -p "$tmp/bin" "$tmp/proc" "$tmp/sys" "$tmp/dev" "$tmp/etc" "$tmp/tmp"
  cp "$(command -v busybox)" "$tmp/bin/busybox"
  for a in sh cat ls id echo sleep grep true false wc head; do ln -s busybox "$tmp/bin/$a"; done
  printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$tmp/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/etc/group"
  tar --numeric-owner -C "$tmp" -c . | docker import --change 'CMD ["/bin/sh"]' - kooi-probe:latest >/dev/null
  rm -rf "$tmp"
fi
docker save kooi-probe:latest -o "$out/probe.tar"
chmod 0644 "$out/probe.tar"
echo "images ready; probe image saved to $out/probe.tar"
