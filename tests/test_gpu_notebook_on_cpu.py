"""notebooks/08_gpu.ipynb on a machine without a GPU: it stops at its first code cell,
saying it needs one, and starts no rank (nbval skips it there; a user runs it anyway)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from process_checks import our_workers

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: nbval runs it"),
]

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "08_gpu.ipynb"


def test_the_gpu_notebook_stops_at_once_and_says_why_on_a_cpu_machine():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:  # as a user opens it after "Clear All Outputs"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(nb, timeout=120, kernel_name="python3")
    with pytest.raises(CellExecutionError) as caught:
        client.execute()
    first = next(cell for cell in nb.cells if cell.cell_type == "code")
    (error,) = [out for out in first.outputs if out.output_type == "error"]
    assert error.ename == "NeedsAGPU"
    # Only the message shows: no traceback of the notebook's own check.
    assert error.traceback == [error.evalue]
    assert "08_gpu.ipynb needs a CUDA GPU" in error.evalue
    assert "02_ddp.ipynb is the same program on CPU ranks" in error.evalue
    assert "NeedsAGPU" in str(caught.value)
    # Nothing after it ran: no mesh was started.
    later = [cell for cell in nb.cells if cell.cell_type == "code"][1:]
    assert all(cell.get("execution_count") is None for cell in later)
    assert our_workers() == {}
