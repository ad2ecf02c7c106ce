#!/usr/bin/env bash
# Refuse, before anything is installed, a Python that constraints.txt was not resolved for.
#
# Why: PYTHON_VERSION is a build argument, but constraints.txt is one joint resolution of vLLM and LMCache for one
# interpreter (joint_deps.py --write records it in the header line `# python-version: X.Y`). Its pins need not exist for
# another Python: CPython 3.11 fails on networkx==3.7. Refused here, the build stops in seconds with the reason; left to
# pip, it stops minutes later on whichever pin has no distribution for that interpreter.
#
# Usage: check-python.sh PYTHON CONSTRAINTS
#   PYTHON: a version X.Y (the PYTHON_VERSION build argument, checked before apt installs anything), or the
#   interpreter the venv is made from, e.g. python3.12 (asked for its version).
set -euo pipefail

prog=check-python
fail() {
    echo "$prog: error: $1" >&2
    exit 1
}

[ "$#" -eq 2 ] || fail "expected PYTHON and CONSTRAINTS but got $# argument(s); see the usage line of $0."
python="$1"
constraints="$2"
name="$(basename "$constraints")"
[ -r "$constraints" ] || fail "expected the constraints file at $constraints but cannot read it."
resolved_for="$(sed -n 's/^# python-version: \([0-9][0-9]*\.[0-9][0-9]*\)$/\1/p' "$constraints")"
[ -n "$resolved_for" ] \
    || fail "expected a '# python-version: X.Y' line in $constraints but found none; regenerate it with joint_deps.py --write."
if [[ "$python" =~ ^[0-9]+\.[0-9]+$ ]]; then
    found="$python"
    subject="PYTHON_VERSION"
else
    found="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
        || fail "expected a Python interpreter at '$python' but it does not run; set PYTHON_VERSION to an installed python3.X."
    subject="$python"
fi
[ "$found" = "$resolved_for" ] \
    || fail "expected Python $resolved_for, the only one $name was resolved for, but $subject is $found; build with --build-arg PYTHON_VERSION=$resolved_for, or set TARGET_PYTHON in joint_deps.py to $found and regenerate $name (joint_deps.py --python python$found --write)."
echo "$prog: $subject is Python $found, the one $name was resolved for."
