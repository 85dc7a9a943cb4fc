#!/usr/bin/env bash
# Run the README's commands in order in a fresh clone of this repository's HEAD: the quick start
# (scripts/quickstart.sh), then every command of the "Running" block. Fails (exit 1) when a command
# exits non-zero or prints an `error:` line; prints each command's exit status and time.
#
#   bash scripts/check_readme.sh [DIR]      # DIR: where to clone (default: a new temporary folder)
#
# The clone's .venv is a link to this checkout's (set up with scripts/setup.sh first), so nothing
# is downloaded; train.py runs the clone's code (the .venv points back at this checkout at exit). Takes 10-30 minutes on 2 cores (8-rank runs).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$(mktemp -d "${TMPDIR:-/tmp}/megatron_topo-readme.XXXXXX")}"
[ -x "$src/.venv/bin/python" ] || { echo "check_readme: error: no $src/.venv; run scripts/setup.sh first" >&2; exit 2; }
[ ! -e "$dir/repo" ] || { echo "check_readme: error: $dir/repo exists; give an empty folder" >&2; exit 2; }
git clone -q "$src" "$dir/repo"
ln -s "$src/.venv" "$dir/repo/.venv"
# the quick start installs the clone editable into the shared .venv: point it back at this checkout after
trap '(cd "$src" && bash scripts/setup.sh > /dev/null) || echo "check_readme: warning: run scripts/setup.sh in $src again" >&2' EXIT
cd "$dir/repo"
# the commands: block 1's quick start, then the Running block (continuation lines joined)
mapfile -t cmds < <(
    echo "bash scripts/quickstart.sh"
    awk '/^## Running/{r=1} r&&/^```bash/{f=1;next} f&&/^```/{exit} f' README.md \
        | sed -e 's/[[:space:]]*#.*$//' | awk '{ if (sub(/\\$/, "")) { buf = buf $0 } else { print buf $0; buf = "" } }' \
        | grep -v '^[[:space:]]*$')
fail=0
export OMP_NUM_THREADS=1
for c in "${cmds[@]}"; do
    t0=$(date +%s)
    set +e
    bash -c "$c" > "$dir/out.log" 2> "$dir/err.log"
    rc=$?
    set -e
    errs=$(cat "$dir/err.log" "$dir/out.log" | grep -c '^error:' || true)
    echo "check_readme: exit $rc, $errs error lines, $(( $(date +%s) - t0 )) s: $c"
    if [ "$rc" -ne 0 ] || [ "$errs" -ne 0 ]; then
        fail=1
        tail -5 "$dir/err.log" | sed 's/^/    /'
    fi
done
[ "$fail" = 0 ] && echo "check_readme: every command exited 0 without an error line ($dir/repo)"
exit "$fail"
