#!/usr/bin/env bash
# Sets up if needed, then trains: scripts/run.sh CONFIG [key=value ...]
# e.g. scripts/run.sh configs/quickstart.yaml optim.lr=0.05
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 1 ]]; then
  echo "usage: scripts/run.sh CONFIG [key=value ...]" >&2
  exit 2
fi
scripts/setup.sh --quickstart >&2
exec build/trainer train "$@"
