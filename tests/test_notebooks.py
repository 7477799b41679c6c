"""Execute every notebook with nbclient on a tiny size (KVSIM_NB_REQUESTS) and fail on any raising cell.

Also checks they are stored without outputs, so the repository never carries stale numbers.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = (
    "01_three_wastes.ipynb",
    "02_capacity_planning.ipynb",
    "03_calibration.ipynb",
    "04_modern_models.ipynb",
)
TINY_REQUESTS = "40"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_without_outputs(name: str) -> None:
    notebook = nbformat.read(REPO_ROOT / "notebooks" / name, as_version=4)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells, f"{name} has no code"
    for cell in code_cells:
        assert cell.outputs == [] and cell.execution_count is None, f"{name} was saved with outputs"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSIM_NB_REQUESTS", TINY_REQUESTS)
    notebook = nbformat.read(REPO_ROOT / "notebooks" / name, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        allow_errors=False,
        resources={"metadata": {"path": str(REPO_ROOT / "notebooks")}},
    )
    client.execute()  # raises CellExecutionError naming the cell when any cell raises
    figures = sum(
        1
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    )
    assert figures >= 1, f"{name} drew no figure"
