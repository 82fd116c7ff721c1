#!/usr/bin/env bash
# Proves the README's two commands on a fresh machine: debootstraps a minimal Debian bookworm
# root, gives it this machine's apt sources, apt and pip configuration and CA bundle (so it
# reaches the registries as this machine does), copies a clean clone of HEAD and ../shared in,
# and inside a chroot runs `scripts/run.sh configs/quickstart.yaml` then `scripts/test.sh`.
# Reports the time from nothing to the first training step. Takes many minutes; not part of CI.
# Needs root. Usage: scripts/check-fresh.sh [--with-cuda] [DIR]   (DIR default /tmp/ferry-fresh)
#   --with-cuda  also bind /usr/local/cuda read-only, as on this project's machine image, so the
#                CUDA backend is configured and compiled too
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

with_cuda=0
if [[ "${1:-}" == "--with-cuda" ]]; then
  with_cuda=1
  shift
fi
root="${1:-/tmp/ferry-fresh}"
if [[ $(id -u) -ne 0 ]]; then
  echo "check-fresh: needs root (debootstrap, chroot, mount)" >&2
  exit 2
fi
if [[ ! -d ../shared ]]; then
  echo "check-fresh: ../shared is missing beside the checkout (the tests read its fixtures)" >&2
  exit 2
fi

log() { printf '[check-fresh %s] %s\n' "$(date +%T)" "$*"; }

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# The mirror this machine's apt uses (deb822 first, one-line format as a fallback).
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [[ -z "$mirror" ]]; then
  mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
fi
mirror="${mirror:-http://deb.debian.org/debian}"

# Every mount here is private (nothing propagates to or from this machine's own /dev, /proc or
# /sys) and undone on exit; the root is deleted only after whatever a killed run left mounted
# under it is unmounted, and never across a file-system boundary.
mounts=()
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
unmount_under() {
  awk -v r="$1" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
}
bind() {  # bind SRC DST [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  mount --make-private "$2"
  if [[ "${3:-}" == ro ]]; then mount -o remount,bind,ro "$2"; fi
}
fresh_mount() {  # fresh_mount TYPE DST [OPTIONS]: a new instance, not this machine's
  mkdir -p "$2"
  if [[ -n "${3:-}" ]]; then mount -t "$1" -o "$3" "$1" "$2"; else mount -t "$1" "$1" "$2"; fi
  mounts+=("$2")
  mount --make-private "$2"
}

t0=$(date +%s)
log "debootstrap --variant=minbase bookworm $root $mirror"
unmount_under "$root"
if awk -v r="$root" '$2 == r || index($2, r "/") == 1 {found = 1} END {exit !found}' /proc/mounts; then
  echo "check-fresh: something is still mounted under $root; not deleting it" >&2
  exit 1
fi
rm -rf --one-file-system "$root"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log"; exit 1; }
log "minimal root ready in $(($(date +%s) - t0)) s"

# This machine's way to the registries: apt sources and configuration, pip configuration and
# environment, the CA bundle, name resolution.
cp -a /etc/apt/sources.list.d/. "$root/etc/apt/sources.list.d/"
# debootstrap's own sources.list would name the mirror a second time: keep only this machine's.
rm -f "$root/etc/apt/sources.list"
if [[ -f /etc/apt/sources.list ]]; then cp /etc/apt/sources.list "$root/etc/apt/sources.list"; fi
cp -a /etc/apt/apt.conf.d/. "$root/etc/apt/apt.conf.d/"
if [[ -f /etc/pip.conf ]]; then cp /etc/pip.conf "$root/etc/pip.conf"; fi
mkdir -p "$root/etc/ssl/certs" "$root/usr/local/share/ca-certificates"
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
# This machine's own CAs too, so that installing Debian's ca-certificates in the root (setup.sh
# does) rebuilds a bundle that still trusts the registries' proxies.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp -L /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# An installed Debian system resolves its own hostname from /etc/hosts; debootstrap's minbase
# root has none, and every lookup of it (Open MPI's, at each mpirun's start) then waits on DNS
# for seconds: two concurrent 2-rank jobs (shared_links_test) stopped overlapping.
if [[ ! -f $root/etc/hosts ]]; then
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" > "$root/etc/hosts"
fi

# A clean clone of what is committed, with shared/ beside it, as CI lays it out.
mkdir -p "$root/work"
git clone -q --no-hardlinks "$repo" "$root/work/main"
cp -a ../shared "$root/work/shared"

fresh_mount proc "$root/proc"
fresh_mount sysfs "$root/sys"
fresh_mount devpts "$root/dev/pts" newinstance,ptmxmode=0666
fresh_mount tmpfs "$root/dev/shm" mode=1777
# The root's own device nodes (debootstrap makes most of them).
for node in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
  read -r name major minor <<<"$node"
  [[ -c "$root/dev/$name" ]] || mknod -m 666 "$root/dev/$name" c "$major" "$minor"
done
ln -sfn pts/ptmx "$root/dev/ptmx"
ln -sfn /proc/self/fd "$root/dev/fd"
if ((with_cuda)) && [[ -d /usr/local/cuda ]]; then
  cuda_real=$(readlink -f /usr/local/cuda)
  bind "$cuda_real" "$root/usr/local/cuda" ro
fi

# Only the variables this machine sets for its registries pass into the chroot.
env_pass=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
for v in $(env | grep -oE '^(PIP_[A-Z_]+|SSL_CERT_[A-Z_]+|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE)=' | tr -d =); do
  env_pass+=("$v=${!v}")
done
# A find-links folder the pip configuration names must exist in the root too.
if [[ -n "${PIP_FIND_LINKS:-}" && -d "${PIP_FIND_LINKS}" ]]; then
  bind "$PIP_FIND_LINKS" "$root$PIP_FIND_LINKS" ro
fi

in_root() { chroot "$root" /usr/bin/env -i "${env_pass[@]}" /bin/bash -c "$1"; }

# Command 1: the quickstart. Every output line is stamped with seconds since the start so the
# first training step's time can be read off.
log "command 1: scripts/run.sh configs/quickstart.yaml"
t1=$(date +%s%N)
set +e
in_root 'cd /work/main && scripts/run.sh configs/quickstart.yaml' 2>&1 |
  while IFS= read -r line; do
    ms=$((($(date +%s%N) - t1) / 1000000))
    printf '%6d.%d  %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$line"
  done | tee "$root.run.log"
rc1=${PIPESTATUS[0]}
set -e
first_step=$(grep -m1 -E ' step +[0-9]+' "$root.run.log" | awk '{print $1}')
log "command 1 exit $rc1; first training step logged at ${first_step:-never} s from nothing"
((rc1 == 0)) || { log "FAIL: the quickstart did not succeed"; exit 1; }

log "command 2: scripts/test.sh"
t2=$(date +%s)
set +e
in_root 'cd /work/main && scripts/test.sh' >"$root.test.log" 2>&1
rc2=$?
set -e
tail -25 "$root.test.log"
log "command 2 exit $rc2 in $(($(date +%s) - t2)) s"
((rc2 == 0)) || { log "FAIL: the tests did not pass (full log: $root.test.log)"; exit 1; }
log "PASS: both README commands succeed in a fresh minbase root ($(($(date +%s) - t0)) s in all)"
