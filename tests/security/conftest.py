"""An unprivileged local user for the attacks, made for the session and removed after."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

ATTACKER_PREFIX = "mnbattk"

# Workers import the actor classes of these tests by reference, as for tests/
# (tests/conftest.py): this directory goes on their path too.
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_HERE, os.environ.get("PYTHONPATH", "")) if p
)


class Attacker:
    """Runs Python code as another user of this machine (no access to our files)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _argv(self, code: str, args: tuple[str, ...]) -> list[str]:
        return [
            "setpriv", f"--reuid={self.name}", f"--regid={self.name}", "--init-groups",
            sys.executable, "-c", code, *args,
        ]  # fmt: skip

    def run(self, code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            self._argv(code, args), capture_output=True, text=True, timeout=timeout, cwd="/"
        )

    def popen(self, code: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            self._argv(code, args),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
        )  # fmt: skip


@pytest.fixture(scope="session")
def attacker() -> Iterator[Attacker]:
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv to act as another user")
    name = f"{ATTACKER_PREFIX}{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", name], check=True)
    try:
        yield Attacker(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        subprocess.run(["userdel", name], check=False)
