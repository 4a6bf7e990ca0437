"""The command line (``monarch-nb``, also ``python -m monarch_nb``): help and version."""

import subprocess
import sys

import monarch_nb


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch_nb", *args], capture_output=True, text=True, timeout=60
    )


def test_help_names_the_installed_command_in_plain_text():
    out = run_cli("--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: monarch-nb ")
    assert "``" not in out.stdout  # no reST markup in a terminal
    for command in ("demo", "agent", "keygen"):
        assert command in out.stdout


def test_version_prints_the_package_version():
    out = run_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"monarch-nb {monarch_nb.__version__}\n"


def test_no_command_is_a_usage_error_that_names_the_choices():
    out = run_cli()
    assert out.returncode == 2
    assert "monarch-nb: error: the following arguments are required: command" in out.stderr
