#!/usr/bin/env bash
# Set up the machine if needed, then run the end-to-end demo.
#
#   bash scripts/demo.sh [leap demo args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
exec .venv/bin/leap demo "$@"
