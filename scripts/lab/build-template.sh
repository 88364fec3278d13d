#!/bin/sh
# Build the lab's Debian 12 container template with debootstrap (minbase + systemd + sshd + python3),
# with extra CA certificates installed (a TLS-intercepting proxy's, a corporate CA).
# Usage: build-template.sh OUT.tar.gz MIRROR "CA1.crt CA2.crt ..."
set -eu
usage='usage: build-template.sh OUT.tar.gz MIRROR ["CA1.crt CA2.crt ..."] (run as root: debootstrap and chroot)'
case "${1:-}" in -h|--help) echo "$usage"; exit 0 ;; esac
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "$usage" >&2; exit 2; }
out=$1 mirror=$2 cas=${3:-}
[ -d "$(dirname "$out")" ] || { echo "build-template.sh: $(dirname "$out") is not a folder" >&2; exit 2; }
for ca in $cas; do [ -f "$ca" ] || { echo "build-template.sh: extra CA certificate $ca not found" >&2; exit 2; }; done
work=$(mktemp -d /var/tmp/glm5-template.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,openssh-server,python3,python3-apt,ca-certificates,iproute2,procps,sudo,less \
  bookworm "$root" "$mirror"
for ca in $cas; do
  cp "$ca" "$root/usr/local/share/ca-certificates/$(basename "${ca%.*}").crt"
done
chroot "$root" update-ca-certificates
# Host keys are made per container; a minimal /etc/fstab; no getty on the lab's shared console.
rm -f "$root"/etc/ssh/ssh_host_*
: > "$root/etc/fstab"
: > "$root/etc/machine-id"; rm -f "$root/var/lib/dbus/machine-id"
chroot "$root" systemctl mask getty@tty1.service serial-getty@.service console-getty.service systemd-networkd.service >/dev/null
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
tar -czf "$out.tmp" -C "$root" --numeric-owner .
mv "$out.tmp" "$out"
echo "template written: $out ($(du -h "$out" | cut -f1))"
