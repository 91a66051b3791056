#!/usr/bin/env bash
# Run the whole test suite (unit + real-Docker). pytest's "no tests ran" (exit 5)
# counts as a failure: a green run must have tested something.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check . || exit 1
.venv/bin/mypy || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "no tests were collected: failing" >&2; exit 1; fi
exit $rc
