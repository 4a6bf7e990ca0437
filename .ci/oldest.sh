#!/usr/bin/env bash
# The kernel-facing tests against the oldest releases pyproject.toml allows
# (.ci/oldest.txt), in a fresh virtualenv: the rest of CI runs today's newest
# releases, so both ends of each range are tested. Prints pytest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m venv "$work/venv"
venv_python=$work/venv/bin/python
"$venv_python" -m pip install --quiet "torch==2.13.0"
"$venv_python" -m pip install --quiet -c .ci/oldest.txt -e ".[test]"
"$venv_python" -m pip list 2>/dev/null |
    grep -iE '^(ipython|ipykernel|jupyter_client|ipywidgets|pyzmq|cloudpickle) ' |
    sed 's/^/oldest: /'
# What differs between releases: magics, remote tracebacks and cell numbers,
# output routed into cells, widgets and the debugger through a real kernel.
"$venv_python" -m pytest -p no:cacheprovider -q -o addopts="--strict-markers -ra" \
    tests/test_magics_extension.py tests/test_magics_output.py tests/test_magics_run.py \
    tests/test_widgets_kernel.py tests/test_debug_kernel.py
