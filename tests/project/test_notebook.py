"""The quickstart notebook runs top to bottom in a fresh kernel of this environment's Python.

The kernel is pinned to ``sys.executable`` through a kernelspec written for the test (found first
through ``JUPYTER_PATH``), so a ``python3`` kernel registered elsewhere on the machine (another
interpreter without shardwise) can never be picked up instead.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"
KERNEL = "shardwise-test-python"


# shardwise's public API is what ``import shardwise`` exports: no submodule paths, no _names
PRIVATE = re.compile(
    r"\bshardwise\.[a-z_]+\.|\bfrom shardwise\.|\bshardwise\._|\bimport shardwise\."
)


def test_quickstart_notebook_uses_public_api_only() -> None:
    import nbformat

    import shardwise

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "import shardwise" in code
    assert PRIVATE.findall(code) == []
    used = set(re.findall(r"\bshardwise\.(\w+)", code))
    assert used and used <= set(shardwise.__all__), used - set(shardwise.__all__)


@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "shardwise test",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # warnings the notebook's own code causes show as stderr output (checked below): it has no
    # filter of its own, so none may come from shardwise or what it calls
    monkeypatch.setenv("PYTHONWARNINGS", "default")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.cells, "empty notebook"
    # one extra cell reports which interpreter ran the notebook
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    NotebookClient(
        nb, kernel_name=KERNEL, timeout=300, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    errs = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "Warning" not in errs, errs
    assert text.strip().splitlines()[-1] == sys.executable
    assert "shards written" in text and "refused: cannot append along 'step'" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the map and the shard layout
