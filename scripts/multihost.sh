#!/usr/bin/env bash
# One mpirun job across several "hosts" made of Linux namespaces on this machine, so the
# multi-host path (OpenMPI's rsh launch, TCP between hosts, per-node ledgers and placement,
# shared checkpoints) runs for real without a cluster (Note [Hosts made of namespaces]).
#
# Usage: scripts/multihost.sh [--hosts N] [--ranks-per-host R] [--local-to-host0 DIR]
#          [--tcp-retries2 K] -- TRAINER_ARGS...
#   e.g. scripts/multihost.sh --hosts 2 --ranks-per-host 2 -- train configs/quickstart.yaml
# Runs `build/trainer TRAINER_ARGS` as N*R ranks, R per host, and exits with its status.
# --local-to-host0 DIR: DIR is seen by host 0 only (the other hosts see an empty folder there),
# as a folder on host 0's own disk would be.
# --tcp-retries2 K: every host's net.ipv4.tcp_retries2 (its own, per network namespace): how
# many times TCP resends before it gives a connection up, so how soon a host that dropped off
# the network is noticed (Note [A host lost from the network]).
#
# Note [A host lost from the network]
# A host whose processes die (kill -9, a crash) closes its TCP connections, and mpirun ends the
# job at once, naming the host whose daemon it lost. A host that drops off the network (a cable,
# a switch port, a kernel panic) closes nothing: the other ranks block in their all-reduce until
# comm.timeout_s, and the watchdog names the ranks that do not answer and calls MPI_Abort; but
# mpirun (Open MPI 4.1 has no daemon heartbeat) then waits for that host's daemon until TCP gives
# up resending to it, after net.ipv4.tcp_retries2 retries (15 by default: about 15 minutes).
# Clusters set it lower on their nodes (5: about 13 s); the namespace hosts take it per host.
# Needs root (namespaces, mounts). Everything it makes is removed on exit, even on failure.
#
# Note [Hosts made of namespaces]
# Host h is a long-lived process in its own network, UTS (hostname ferry-host<h>), IPC and mount
# namespaces, with a private /dev/shm (so each host has its own link ledger, as a real node
# does) and an /etc/hosts naming every host. The hosts' network namespaces are joined by veth
# pairs to a bridge that lives in a namespace of its own: the addresses exist only inside these
# namespaces. mpirun runs on host 0; OpenMPI's rsh agent is scripts/multihost_agent.sh, which
# enters the named host's namespaces (nsenter) instead of using ssh. OpenMPI is told to use
# only the bridge's subnet (btl tcp,self; btl_tcp_if_include and oob_tcp_if_include), and to
# keep its session directories in this run's folder, removed on exit with it (a host killed
# whole cannot remove its own from /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

hosts=2
per_host=2
local_dir=""
tcp_retries2=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --ranks-per-host) per_host="$2"; shift 2 ;;
    --local-to-host0) local_dir="$(realpath -m "$2")"; shift 2 ;;
    --tcp-retries2) tcp_retries2="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: scripts/multihost.sh [--hosts N] [--ranks-per-host R]" \
         "[--local-to-host0 DIR] [--tcp-retries2 K] -- TRAINER_ARGS..." >&2
       exit 2 ;;
  esac
done
if [[ $# -eq 0 ]]; then
  echo "multihost: give the trainer's arguments after --" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "multihost: needs root (network, UTS, IPC and mount namespaces)" >&2
  exit 77
fi
if [[ ! -x build/trainer ]]; then
  echo "multihost: build/trainer is missing; run scripts/setup.sh first" >&2
  exit 2
fi

tag="ferry$$"
subnet_prefix="10.213.$(($$ % 200 + 20))"
work=$(mktemp -d "/tmp/${tag}.XXXX")
bridge_ns="${tag}-br"
host_pids=()

cleanup() {
  set +e
  for pid in "${host_pids[@]}"; do
    # Every process left on that host (ranks, orted), then the host itself.
    for p in $(ip netns pids "${tag}-h${pid%%:*}" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    kill -9 "${pid##*:}" 2>/dev/null
  done
  for ((h = 0; h < hosts; ++h)); do ip netns del "${tag}-h$h" 2>/dev/null; done
  ip netns del "$bridge_ns" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# A signal (timeout(1), ctrl-c) ends the script through exit, so the EXIT trap still cleans up:
# a bash killed by a signal it does not trap runs no trap at all.
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$bridge_ns"
ip -n "$bridge_ns" link add br0 type bridge
ip -n "$bridge_ns" link set br0 up
: >"$work/hosts"
echo "127.0.0.1 localhost" >>"$work/hosts"
for ((h = 0; h < hosts; ++h)); do
  echo "$subnet_prefix.$((h + 1)) ferry-host$h" >>"$work/hosts"
done
for ((h = 0; h < hosts; ++h)); do
  ns="${tag}-h$h"
  ip netns add "$ns"
  ip link add "v${tag}h$h" type veth peer name "b${tag}h$h"
  ip link set "v${tag}h$h" netns "$ns"
  ip link set "b${tag}h$h" netns "$bridge_ns"
  ip -n "$bridge_ns" link set "b${tag}h$h" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "v${tag}h$h" name eth0
  ip -n "$ns" addr add "$subnet_prefix.$((h + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [[ -n "$tcp_retries2" ]]; then
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_retries2="$tcp_retries2"
  fi
  # The host: its own hostname, IPC, /dev/shm and /etc/hosts; it sleeps until killed.
  ip netns exec "$ns" unshare --uts --ipc --mount --propagation private --fork bash -c "
    hostname ferry-host$h
    mount -t tmpfs -o size=256m tmpfs /dev/shm
    mount --bind '$work/hosts' /etc/hosts
    if [[ -n '$local_dir' && $h -gt 0 ]]; then
      mkdir -p '$local_dir' && mount -t tmpfs -o size=16m tmpfs '$local_dir'
    fi
    echo ready > '$work/host$h.ready'
    exec sleep infinity" &
  disown $!
  for _ in $(seq 100); do [[ -f "$work/host$h.ready" ]] && break; sleep 0.05; done
  [[ -f "$work/host$h.ready" ]] || { echo "multihost: host $h did not start" >&2; exit 1; }
  # The process inside the namespaces: unshare's child (the bash that became sleep).
  inner=$(pgrep -P $! | head -1)
  [[ -n "$inner" ]] || { echo "multihost: host $h has no process" >&2; exit 1; }
  host_pids+=("$h:$inner")
  echo "ferry-host$h $inner" >>"$work/host_pids"
done

export FERRY_MULTIHOST_PIDS="$work/host_pids"
host_list=""
for ((h = 0; h < hosts; ++h)); do host_list+="${host_list:+,}ferry-host$h:$per_host"; done
ranks=$((hosts * per_host))
first_pid=${host_pids[0]##*:}
set +e
nsenter -t "$first_pid" --net --uts --ipc --mount \
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  FERRY_MULTIHOST_PIDS="$work/host_pids" \
  mpirun -np "$ranks" --host "$host_list" --bind-to none -wdir "$(pwd)" \
  --mca plm_rsh_agent "$root/scripts/multihost_agent.sh" \
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet_prefix.0/24" \
  --mca oob_tcp_if_include "$subnet_prefix.0/24" \
  --mca orte_tmpdir_base "$work" \
  -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
  "$root/build/trainer" "$@"
status=$?
set -e
exit $status
