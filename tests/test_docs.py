"""Docs are code: every code block in README.md and docs/*.md runs here.

Each page is a session, in order, the way a reader follows it:

- ```` ```python ```` blocks run in one fresh Python process per page, each
  block after the one before, so a page may build on its earlier blocks (a
  snippet that uses an undefined name fails here);
- ```` ```ipython ```` blocks are notebook cells (``%mesh``, ``%%mesh``): they
  run in one real Jupyter kernel per page, in order;
- ```` ```bash ```` blocks are commands a reader types: each line must be run,
  as written, by CI's own scripts (``.ci/``), which is where they are tested,
  or be a ``python SCRIPT`` that answers ``--help``, or say why CI cannot run
  it (``# (not run by CI: ...)``);
- other blocks (``text``, ``console``, an unlabelled block) show output or
  layout and are not run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)

# Runs the page's python blocks in order in one namespace; says which block failed.
_RUNNER = textwrap.dedent(
    """
    import json, sys, traceback
    blocks = json.load(open(sys.argv[1]))
    namespace = {"__name__": "__main__"}
    for line, source in blocks:
        try:
            exec(compile(source, f"{sys.argv[2]}:{line}", "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            print(f"DOCS-BLOCK-FAILED {sys.argv[2]}:{line}", file=sys.stderr)
            sys.exit(1)
    """
)


def blocks(page: Path, language: str) -> list[tuple[int, str]]:
    """``(line number, source)`` of every block of ``language`` on ``page``."""
    text = page.read_text()
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(2))
        for m in _FENCE.finditer(text)
        if m.group(1) == language
    ]


def _pages_with(language: str) -> list[Path]:
    return [p for p in PAGES if blocks(p, language)]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", _pages_with("python"), ids=_name)
def test_python_blocks_run_in_order(page, tmp_path):
    source = tmp_path / "blocks.json"
    source.write_text(json.dumps(blocks(page, "python")))
    runner = tmp_path / "runner.py"
    runner.write_text(_RUNNER)
    out = subprocess.run(
        [sys.executable, str(runner), str(source), _name(page)],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", _pages_with("ipython"), ids=_name)
def test_notebook_blocks_run_in_a_kernel(page):
    from kernel_utils import Kernel

    with Kernel() as kernel:
        for line, source in blocks(page, "ipython"):
            reply = kernel.execute(source.rstrip("\n"), timeout=300)
            assert reply.status == "ok", f"{_name(page)}:{line}: {reply.text()[-3000:]}"
        kernel.execute("%mesh stop --all", timeout=120)


def _ci_commands() -> str:
    return "\n".join(p.read_text() for p in (ROOT / ".ci").iterdir() if p.is_file())


_NOT_RUN = re.compile(r"#\s*\(not run by CI: [^)]+\)\s*$")


@pytest.mark.parametrize("page", _pages_with("bash"), ids=_name)
def test_bash_blocks_are_run_or_checked(page):
    """A command on a page is run as written by a script in .ci/; a ``python
    SCRIPT`` command at least answers ``--help``; anything else says why CI
    cannot run it (``# (not run by CI: ...)``)."""
    ci = _ci_commands()
    for line, source in blocks(page, "bash"):
        for command in source.splitlines():
            if _NOT_RUN.search(command) or not command.strip() or command.startswith("#"):
                continue
            command = command.split("  #", 1)[0].strip()
            if command in ci or command == "bash .ci/run":  # the second is CI itself
                continue
            words = command.split()
            assert words[0] == "python", (
                f"{_name(page)}:{line}: {command!r} is run by no script in .ci/; run it "
                "there (so CI tests it), or end the line with '# (not run by CI: why)'"
            )
            assert len(words) > 1, f"{_name(page)}:{line}: {command!r} names no script"
            target = words[1:3] if words[1] == "-m" else words[1:2]
            out = subprocess.run(
                [sys.executable, *target, "--help"],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=ROOT,
            )
            assert out.returncode == 0, f"{_name(page)}:{line}: {command!r}: {out.stderr[-2000:]}"


def test_the_fence_parser_finds_every_kind_of_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("x\n```python\na = 1\n```\n\n```ipython\n%mesh\n```\n```\nout\n```\n")
    assert blocks(page, "python") == [(2, "a = 1\n")]
    assert blocks(page, "ipython") == [(6, "%mesh\n")]
    assert blocks(page, "") == [(9, "out\n")]
