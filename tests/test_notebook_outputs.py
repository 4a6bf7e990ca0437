"""The example notebooks' saved outputs name no path of the machine they ran on.

A traceback saved in a notebook says ``File "/root/.pyenv/.../bdb.py"`` or
``/home/alice/src/monarch_nb/...``: someone's home, user name and layout,
shipped to every reader. Saved outputs keep only the part that means
something (``.../lib/python3.11/bdb.py``, ``.../monarch_nb/debug/_remote.py``).

``python tests/test_notebook_outputs.py notebooks/*.ipynb`` rewrites the
paths of notebooks that hold some, in place.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

# An absolute path under a directory that belongs to a machine or a user (not
# preceded by a word character, a dot, a colon or a slash: ".../lib/python3.11/x"
# and "https://host/home/x" are not local paths). Windows homes too.
LOCAL_PATH = re.compile(
    r"(?<![\w.:/])/(?:root|home|Users|tmp|work|private|mnt|srv|opt|usr|var|scratch|data)/[^\s\"'&<>]*"
    r"|\b[A-Za-z]:\\\\?Users\\\\?[^\s\"'&<>]*"
)
# What a rewrite keeps of a path: from the first of these on.
_KEEP = re.compile(
    r"(?<![\w.:/])/(?:[\w.+-]+/)*?(site-packages/|lib/python3\.\d+/|monarch_nb/|notebooks/)"
)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)


def local_paths(notebook: Path) -> list[tuple[int, str]]:
    """(cell index, path) for every local path in the notebook's saved outputs."""
    cells = json.loads(notebook.read_text())["cells"]
    found = []
    for index, cell in enumerate(cells):
        for text in _strings(cell.get("outputs", [])):
            found += [(index, match.group(0)[:120]) for match in LOCAL_PATH.finditer(text)]
    return found


def strip_paths(notebook: Path) -> int:
    """Rewrite the saved outputs' paths to ``.../site-packages/...`` and alike; how many
    strings changed."""
    text = notebook.read_text()
    data = json.loads(text)
    changed = 0

    def fix(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, str):
            new = _KEEP.sub(lambda m: ".../" + m.group(1), value)
            changed += new != value
            return new
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    for cell in data["cells"]:
        if "outputs" in cell:
            cell["outputs"] = fix(cell["outputs"])
    if changed:
        notebook.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return changed


def test_the_notebooks_are_found() -> None:
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.name for n in NOTEBOOKS])
def test_saved_outputs_hold_no_local_path(notebook: Path) -> None:
    found = local_paths(notebook)
    assert not found, (
        f"{notebook.name}: saved outputs name paths of the machine they ran on "
        f"(cell index, path): {found[:5]}; run `python tests/test_notebook_outputs.py "
        f"notebooks/{notebook.name}` to rewrite them as .../site-packages/... and alike"
    )


def test_the_check_sees_a_home_and_the_rewrite_clears_it(tmp_path: Path) -> None:
    # The check fails on what 05_debugging.ipynb held, and the rewrite fixes it.
    saved = {
        "cells": [
            {
                "cell_type": "code",
                "source": "",
                "metadata": {},
                "outputs": [
                    {
                        "output_type": "error",
                        "ename": "E",
                        "evalue": "",
                        "traceback": [
                            '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/bdb.py", line 9',
                            '  File "/home/alice/src/monarch_nb/debug/_remote.py", line 7',
                        ],
                    }
                ],
            }
        ]
    }
    notebook = tmp_path / "n.ipynb"
    notebook.write_text(json.dumps(saved))
    assert [path for _, path in local_paths(notebook)] == [
        "/root/.pyenv/versions/3.11.7/lib/python3.11/bdb.py",
        "/home/alice/src/monarch_nb/debug/_remote.py",
    ]
    assert strip_paths(notebook) == 2
    assert local_paths(notebook) == []
    traceback = json.loads(notebook.read_text())["cells"][0]["outputs"][0]["traceback"]
    assert traceback[0] == '  File ".../lib/python3.11/bdb.py", line 9'
    assert traceback[1] == '  File ".../monarch_nb/debug/_remote.py", line 7'


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {strip_paths(Path(name))} strings rewritten")
