#!/usr/bin/env bash
# Build a Debian virtual machine image for QEMU test hosts (the only test hosts here
# whose kernel has AppArmor: the build machines' own kernel has none). No registry, no
# installer: debootstrap from Debian's packages, configured in a chroot at native
# speed (under TCG emulation every fork is ~18x slower), then `mkfs.ext4 -d` into a raw
# image without a partition table. The kernel and initrd are copied out for -kernel.
#
# usage: build.sh SUITE OUTDIR
#   OUTDIR/SUITE.raw, SUITE.vmlinuz, SUITE.initrd, and the ssh key OUTDIR/id_ed25519
#   (user ansible, passwordless sudo). Kept when present and built by this very script
#   (OUTDIR/SUITE.id holds the script's sha256), unless KOOI_REBUILD=1.
# Extra CAs: the host's /usr/local/share/ca-certificates (TLS interception) are trusted.
set -euo pipefail
suite=${1:?suite (bookworm, trixie)}; out=${2:?output directory}
mirror=${KOOI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$out"
stamp=$(sha256sum "$0" | cut -d' ' -f1)
if [ "${KOOI_REBUILD:-0}" != 1 ] && [ "$(cat "$out/$suite.id" 2>/dev/null)" = "$stamp" ] && [ -s "$out/$suite.raw" ] && [ -s "$out/$suite.vmlinuz" ] \
   && [ -s "$out/$suite.initrd" ] && [ -s "$out/id_ed25519" ]; then
  echo "vm image $out/$suite.raw present"; exit 0
fi
for tool in debootstrap mkfs.ext4 ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is required" >&2; exit 3; }
done
[ -s "$out/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C kooi-vm -f "$out/id_ed25519"

work=$(mktemp -d /var/tmp/kooi-vm.XXXXXX)
cleanup() { umount -R "$work/rootfs/proc" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
root="$work/rootfs"
# What the AppArmor scenario needs, installed here rather than in the slow guest:
# the kernel, systemd, ssh, python3 for Ansible, AppArmor, rootful Docker (it applies
# AppArmor profiles to containers), bubblewrap (the jail), and what the rootless engine
# and the shim need (their roles converge with --skip-tags packages: the guest's cgroup
# v2 proves the controllers kooi delegates to the runner's user manager, to the
# rootless engine's containers and to a jail's systemd user scope).
pkgs=linux-image-amd64,initramfs-tools,systemd-sysv,udev,dbus,libpam-systemd,openssh-server,python3,python3-apt,sudo
pkgs=$pkgs,apparmor,apparmor-utils,ca-certificates,iproute2,kmod,docker.io,bubblewrap,busybox-static,procps
pkgs=$pkgs,rootlesskit,slirp4netns,uidmap,dbus-user-session,python3-docker,python3-yaml,python3-testinfra,acl
debootstrap --include="$pkgs" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2; echo "build.sh: debootstrap $suite failed" >&2; exit 1; }

if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
printf 'deb %s %s main\n' "$mirror" "$suite" >"$root/etc/apt/sources.list"
echo "kooi-vm-$suite" >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 kooi-vm-%s\n' "$suite" >"$root/etc/hosts"
printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
# QEMU user networking: DHCP, and its resolver (never the host's).
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en* eth*\n[Network]\nDHCP=ipv4\n' >"$root/etc/systemd/network/10-kooi.network"
printf 'nameserver 10.0.2.3\n' >"$root/etc/resolv.conf"
# Never regenerate the initramfs in the guest (13 min under TCG for one package).
sed -i 's/^update_initramfs=.*/update_initramfs=no/' "$root/etc/initramfs-tools/update-initramfs.conf"
mount -t proc proc "$root/proc"
chroot "$root" sh -e <<'SETUP'
systemctl enable systemd-networkd ssh >/dev/null 2>&1
systemctl disable docker.service docker.socket >/dev/null 2>&1 || true
useradd -m -s /bin/bash ansible
echo 'ansible ALL=(ALL) NOPASSWD: ALL' >/etc/sudoers.d/ansible
chmod 0440 /etc/sudoers.d/ansible
SETUP
umount "$root/proc"
# Docker starts on demand in the scenario (it is slow to start under TCG).
install -d -m 0700 -o 1000 -g 1000 "$root/home/ansible/.ssh"
install -m 0600 -o 1000 -g 1000 "$out/id_ed25519.pub" "$root/home/ansible/.ssh/authorized_keys"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/*
: >"$root/etc/machine-id"
cp "$root"/boot/vmlinuz-* "$out/$suite.vmlinuz.tmp"
cp "$root"/boot/initrd.img-* "$out/$suite.initrd.tmp"
rm -f "$out/$suite.raw.tmp"
mkfs.ext4 -q -F -L kooi-root -d "$root" "$out/$suite.raw.tmp" 4G
mv "$out/$suite.vmlinuz.tmp" "$out/$suite.vmlinuz"
mv "$out/$suite.initrd.tmp" "$out/$suite.initrd"
mv "$out/$suite.raw.tmp" "$out/$suite.raw"
echo "$stamp" >"$out/$suite.id"
chmod 0644 "$out/$suite.raw" "$out/$suite.vmlinuz" "$out/$suite.initrd"
echo "vm image $out/$suite.raw ready"
