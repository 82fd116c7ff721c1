#!/usr/bin/env bash
# Sets up if needed, then runs the whole test suite (ctest). Extra arguments go to ctest,
# e.g. scripts/test.sh -R Topology
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure --timeout 600 -j "$(nproc)" "$@"
