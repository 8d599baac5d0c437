#!/usr/bin/env bash
# Everything CI checks, in one command: setup, local Kafka + Redis, topics, lint, import contracts,
# types, tests.
#
#   bash scripts/test.sh [pytest args...]
#
# Exits non-zero if any step fails. Lint, type and test failures are all reported before exiting,
# so one run shows every problem. Environment: LEAP_TEST_TIMEOUT (overall pytest limit, default
# 60m; CI's own limit is 90 minutes and setup on a fresh machine takes a few of them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

# On CI nothing may outlive the job; on a workstation the services stay up for the next run.
if [ "${CI:-}" = "true" ]; then
  trap 'leap services down >/dev/null 2>&1 || true' EXIT
fi

leap services up
leap topics create

failed=()
run_step() {
  local name=$1
  shift
  printf '\n== %s: %s\n' "$name" "$*"
  if "$@"; then
    return 0
  else
    local rc=$?
    failed+=("$name (exit $rc)")
  fi
}

run_step ruff ruff check .
run_step import-contracts lint-imports --no-cache

packages=()
for pkg in streams features predictor leap tests; do
  # mypy refuses a folder without Python files; skip packages that are still empty
  if [ -n "$(find "$pkg" -name '*.py' -print -quit 2>/dev/null)" ]; then
    packages+=("$pkg")
  fi
done
run_step mypy mypy "${packages[@]}"

printf '\n== pytest\n'
set +e
timeout --kill-after=60s "${LEAP_TEST_TIMEOUT:-60m}" pytest -q --durations=30 "$@"
rc=$?
set -e
case "$rc" in
  0) ;;
  5) failed+=("pytest (exit 5: no tests were collected)") ;;
  124) failed+=("pytest (timed out after ${LEAP_TEST_TIMEOUT:-60m})") ;;
  *) failed+=("pytest (exit $rc)") ;;
esac

if [ "${#failed[@]}" -gt 0 ]; then
  printf '\nFAILED:\n' >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
printf '\nall checks passed\n'
