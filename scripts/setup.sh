#!/usr/bin/env bash
# Create .venv (once), install the pinned requirements and the project itself, editable (each again
# only when requirements.txt or pyproject.toml changes). Offline apart from the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing requirements.txt into .venv (log: .venv/pip.log)"
  if ! .venv/bin/python -m pip install --disable-pip-version-check -r requirements.txt > .venv/pip.log 2>&1; then
    grep -v "^WARNING: Location" .venv/pip.log | tail -20
    echo "setup: pip install failed; full log in .venv/pip.log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
stamp=.venv/.project.sha
# the checkout is part of the stamp: a .venv shared with a clone (scripts/check_readme.sh) is pointed
# back at this checkout's code, not left importing the clone's
want=$( (cat pyproject.toml requirements.txt; pwd -P) | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing megatron_topo editable into .venv (log: .venv/pip-project.log)"
  if ! .venv/bin/python -m pip install --disable-pip-version-check --no-deps --no-build-isolation \
      -e . > .venv/pip-project.log 2>&1; then
    tail -20 .venv/pip-project.log
    echo "setup: pip install -e . failed; full log in .venv/pip-project.log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
