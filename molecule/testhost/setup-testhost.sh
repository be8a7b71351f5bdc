#!/bin/sh
# Runs inside the test-host chroot (see build.sh). Makes a Debian root filesystem boot
# systemd as PID 1 in an unprivileged Docker container, like a small VM.
set -eu
for unit in getty@tty1.service console-getty.service systemd-udevd.service \
    systemd-udevd-kernel.socket systemd-udevd-control.socket systemd-firstboot.service \
    systemd-modules-load.service sys-kernel-config.mount sys-kernel-debug.mount \
    sys-kernel-tracing.mount proc-sys-fs-binfmt_misc.automount \
    systemd-remount-fs.service apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "/etc/systemd/system/$unit"
done
cat >/usr/local/sbin/kooi-testhost-unmask <<'SH'
#!/bin/sh
# Test hosts only: Docker masks parts of /proc and /sys/firmware; a nested engine in a
# user namespace cannot mount a fresh procfs while they are over-mounted.
awk '$5 ~ "^/proc/." || $5 ~ "^/sys/firmware" {print $5}' /proc/self/mountinfo | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null || true; done
SH
chmod 0755 /usr/local/sbin/kooi-testhost-unmask
cat >/etc/systemd/system/kooi-testhost-unmask.service <<'UNIT'
[Unit]
Description=kooi test host: unmask /proc for nested container engines
DefaultDependencies=no
Before=sysinit.target local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/kooi-testhost-unmask

[Install]
WantedBy=sysinit.target
UNIT
mkdir -p /etc/systemd/system/sysinit.target.wants
ln -sf /etc/systemd/system/kooi-testhost-unmask.service /etc/systemd/system/sysinit.target.wants/
echo kooi-testhost >/etc/hostname
