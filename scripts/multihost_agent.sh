#!/usr/bin/env bash
# OpenMPI's rsh agent for scripts/multihost.sh: "multihost_agent.sh [options] HOST COMMAND..."
# runs COMMAND inside the namespaces of HOST (one of the namespace hosts), as ssh would run it
# on a real host (Note [Hosts made of namespaces] in scripts/multihost.sh).
set -euo pipefail
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done  # ssh-style options OpenMPI may pass
host="$1"
shift
pid=$(awk -v h="$host" '$1 == h { print $2 }' "${FERRY_MULTIHOST_PIDS:?not under multihost.sh}")
if [[ -z "$pid" ]]; then
  echo "multihost_agent: unknown host '$host'" >&2
  exit 255
fi
exec nsenter -t "$pid" --net --uts --ipc --mount /bin/sh -c "$*"
