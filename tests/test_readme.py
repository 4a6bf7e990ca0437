"""The front door's promises: the first script prints what it says, and the demo runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def first_example() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## A first script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_first_example_runs_as_a_script(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(first_example())
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "ValueMesh({procs: 4}) {0-3: 0.3" in out.stdout
    assert re.search(r"^\[2\] rank 2 got 2 samples$", out.stdout, re.M)


@pytest.mark.slow
def test_the_demo_runs_headless():
    out = subprocess.run(
        [sys.executable, "-m", "monarch_nb", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warning, from any rank
    assert "slice(procs=1).square.call_one(7) = 49" in out.stdout  # values come labelled
    assert "{'procs': 3} -> shape (1024, 1024), sum 10485760" in out.stdout  # a tensor round trip
    assert "all_reduce of [rank, rank] = ValueMesh({procs: 4}) {0-3: [6.0, 6.0]}" in out.stdout
    assert "was killed by signal SIGKILL" in out.stdout
    assert "square.call(2) after restart() = ValueMesh({procs: 4}) {0-3: 4}" in out.stdout
    assert "stopped: <ProcMesh 'demo' {procs: 4} stopped>" in out.stdout
    unlabelled = [line for line in out.stdout.splitlines() if re.fullmatch(r"[\d{}:\-, ]+", line)]
    assert not unlabelled, f"the demo printed values without saying what they are: {unlabelled}"


def test_the_configuration_table_is_every_setting():
    from monarch_nb.config import table

    text = (ROOT / "docs" / "clusters.md").read_text()
    assert table() in text


_HEADLINE = re.compile(
    r"<!-- headline figures: begin.*?-->\n(.*?)<!-- headline figures: end -->", re.S
)
_STAMP = re.compile(
    r"^Measured (\d{4}-\d\d-\d\d) \([^)]*\), one run of `python benchmarks/headline.py --write`\.$",
    re.M,
)


def _headline(page: str) -> tuple[str, list[str]]:
    block = _HEADLINE.search((ROOT / page).read_text())
    assert block, f"{page} lost its generated figures block"
    stamp = _STAMP.search(block.group(1))
    assert stamp, f"{page}'s figures do not say when and by which command they were measured"
    rows = [
        line for line in block.group(1).splitlines() if line.startswith("| ") and "---" not in line
    ]
    return stamp.group(0), rows[1:]  # without the header row


def test_the_front_page_figures_come_from_the_same_run_as_the_benchmarks_page():
    readme_stamp, readme_rows = _headline("README.md")
    docs_stamp, docs_rows = _headline("docs/benchmarks.md")
    assert readme_stamp == docs_stamp, "README.md and docs/benchmarks.md show different runs"
    assert readme_rows
    assert readme_rows == docs_rows[: len(readme_rows)]


def test_the_readme_names_every_extra_that_pyproject_declares():
    tomllib = pytest.importorskip("tomllib")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"^\| `\[(\w+)\]` \|", text, re.M))
    assert named == set(extras), f"README's extras {sorted(named)} != pyproject's {sorted(extras)}"


def test_each_notebook_has_its_own_number_and_a_line_in_the_readme():
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    numbers = [name.split("_", 1)[0] for name in notebooks]
    assert len(set(numbers)) == len(numbers), f"two notebooks share a number: {notebooks}"
    text = (ROOT / "README.md").read_text()
    missing = [name for name in notebooks if f"| `{name}` |" not in text]
    assert not missing, f"README's notebook table lacks {missing}"


def test_every_code_block_of_the_readme_is_run_or_says_why_not():
    # test_docs runs python, ipython and bash blocks (a bash line CI cannot run
    # says why); a block fenced otherwise would be code that nothing checks.
    fences = re.findall(r"^```(\w*)", (ROOT / "README.md").read_text(), re.M)
    openings = fences[::2]
    assert set(openings) <= {"python", "ipython", "bash"}, openings
    assert "<this repository" not in (ROOT / "README.md").read_text()


def test_the_way_to_a_working_notebook_reads_in_five_minutes():
    # Issue 62: the README reads in five minutes to a working notebook. Everything
    # up to the tour (the quick start: install, the demo, the first notebook) stays
    # under 1,000 words, five minutes at 200 words a minute, commands included.
    text = (ROOT / "README.md").read_text()
    start, _ = text.split("\n## A tour", 1)
    assert "## Quick start" in start
    assert "jupyter lab notebooks/01_quickstart.ipynb" in start
    words = len(start.split())
    assert words <= 1000, f"the quick start is {words} words: more than five minutes' reading"
