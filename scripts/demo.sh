#!/usr/bin/env bash
# The demo experiment (example tasks × oracle, nop, replay), then where the report is.
set -euo pipefail
cd "$(dirname "$0")/.."
plain=()
[ -t 1 ] || plain=(--plain)
.venv/bin/ale exp run examples/demo.yaml "${plain[@]}"
