#!/usr/bin/env bash
# The README's quick-start and notebook commands, run as a new user runs them:
# in a fresh virtualenv (no system site-packages, so no numpy: torch's CPU
# wheel does not install it) with a fresh Jupyter home. The `[test]` extra
# that the rest of CI uses installs numpy and would hide what breaks here.
#
# Checks: numpy is absent; the demo prints no warning; tensors go through an
# actor endpoint and back; `monarch-nb --version` runs; `jupyter lab` serves
# the quickstart notebook with the Mesh panel listed; and nbconvert executes
# that notebook headless without a warning. One venv serves both commands, in
# the order the README gives them (the notebook command adds to the quick
# start's install); then `python -m build`'s wheel replaces the editable
# install there. Prints how long each step took.
set -euo pipefail
cd "$(dirname "$0")/.."

# The README's commands, verbatim: fail if the README stops saying them.
QUICK_START='pip install torch==2.13.0 && pip install -e . && python -m monarch_nb demo'
NOTEBOOK='pip install -e ".[notebook]" && jupyter lab notebooks/01_quickstart.ipynb'
for command in "$QUICK_START" "$NOTEBOOK"; do
    if ! grep -qF -- "$command" README.md; then
        echo "error: README.md no longer says: $command" >&2
        echo "       update .ci/fresh_venv.sh to run what the README says" >&2
        exit 1
    fi
done

work=$(mktemp -d)
server_pid=
cleanup() {
    if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

step() { printf '== fresh venv, %3ds: %s\n' "$SECONDS" "$1"; }
fail() {
    echo "error: $1" >&2
    if [[ -n ${2:-} ]]; then tail -n 40 "$2" >&2; fi
    exit 1
}
# Output a user would read as a problem: warnings, and torch missing numpy.
# Allowed: ipykernel's own notice that nbconvert's kernel talks over TCP
# without CurveZMQ (every nbconvert run with ipykernel >= 7 prints it).
UPSTREAM='Kernel is running over TCP without encryption'
no_warnings() {
    if grep -iE "warn|Failed to initialize NumPy" "$1" | grep -vF "$UPSTREAM"; then
        fail "$2 printed the warnings above" "$1"
    fi
}

SECONDS=0
step "python -m venv (no system site-packages)"
python -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate" # `pip`, `python`, `jupyter` are the venv's, as for a new user
unset PYTHONPATH                 # run what was installed, not a checkout on the path
export JUPYTER_CONFIG_DIR=$work/jupyter/config JUPYTER_DATA_DIR=$work/jupyter/data
export JUPYTER_RUNTIME_DIR=$work/jupyter/runtime

step "$QUICK_START"
(eval "${QUICK_START% && *}") >"$work/install.log" 2>&1 || fail "the quick start's install failed" "$work/install.log"
(eval "${QUICK_START##* && }") >"$work/demo.log" 2>&1 || fail "the demo failed" "$work/demo.log"
grep -q "stopped: <ProcMesh 'demo'" "$work/demo.log" || fail "the demo did not finish" "$work/demo.log"
no_warnings "$work/demo.log" "the demo"
if python -c "import numpy" 2>/dev/null; then
    fail "numpy is installed: this venv no longer tests a machine without it"
fi

step "a tensor round trip through an actor endpoint, numpy absent"
python tests/tensor_round_trip.py >"$work/round_trip.log" 2>&1 || fail "the round trip failed" "$work/round_trip.log"
grep -q "tensor round trips ok" "$work/round_trip.log" || fail "no round trip" "$work/round_trip.log"
no_warnings "$work/round_trip.log" "the tensor round trip"
[[ $(monarch-nb --version) == "monarch-nb "* ]] || fail "monarch-nb --version did not say the version"

step "$NOTEBOOK"
(eval "${NOTEBOOK% && *}") >"$work/install_notebook.log" 2>&1 ||
    fail "the notebook extra's install failed" "$work/install_notebook.log"
jupyter labextension list 2>&1 | grep -q "monarch-nb.*enabled.*OK" ||
    fail "jupyter labextension list does not show monarch-nb enabled"
# The README's jupyter lab command, headless: it must start and serve. JupyterLab
# refuses root without --allow-root, and a CI machine has no browser to open.
lab_options=(--no-browser)
if [[ $EUID -eq 0 ]]; then lab_options+=(--allow-root); fi
# exec: $! is then jupyter-lab itself, not a subshell whose kill would orphan it.
eval "exec ${NOTEBOOK##* && } ${lab_options[*]}" >"$work/lab.log" 2>&1 &
server_pid=$!
for _ in $(seq 120); do
    if grep -q "is running at" "$work/lab.log"; then break; fi
    kill -0 "$server_pid" 2>/dev/null || fail "jupyter lab exited" "$work/lab.log"
    sleep 1
done
grep -q "is running at" "$work/lab.log" || fail "jupyter lab did not start in 120 s" "$work/lab.log"
kill "$server_pid"
wait "$server_pid" || true
server_pid=

step "the quickstart notebook, executed headless (jupyter nbconvert --execute)"
jupyter nbconvert --to notebook --execute notebooks/01_quickstart.ipynb \
    --output-dir "$work" >"$work/nbconvert.log" 2>&1 || fail "the notebook failed" "$work/nbconvert.log"
no_warnings "$work/nbconvert.log" "jupyter nbconvert --execute"
python - "$work/01_quickstart.ipynb" <<'PY' || fail "a cell of the executed notebook warned"
import json, sys

cells = json.load(open(sys.argv[1]))["cells"]
for cell in cells:
    for out in cell.get("outputs", []):
        if out.get("name") == "stderr" and "warn" in "".join(out["text"]).lower():
            sys.exit("".join(cell["source"]) + "\n--- printed ---\n" + "".join(out["text"]))
PY

step "python -m build: a wheel with the panel prebuilt, in place of the editable install"
# The wheel a release would publish: installing it builds nothing (no Node.js,
# no compiler), and JupyterLab finds the panel it carries.
{ pip install build && python -m build --outdir "$work/dist" . &&
    pip uninstall --yes monarch-nb && pip install "$work"/dist/monarch_nb-*.whl; } \
    >"$work/wheel.log" 2>&1 || fail "building or installing the wheel failed" "$work/wheel.log"
(cd "$work" && python -c "import monarch_nb.native._memory, monarch_nb; print(monarch_nb.__file__)") |
    grep -q "/site-packages/monarch_nb/" || fail "monarch_nb does not come from the wheel"
jupyter labextension list 2>&1 | grep -q "monarch-nb.*enabled.*OK" ||
    fail "the wheel's panel is not listed by jupyter labextension list"

step "done"
