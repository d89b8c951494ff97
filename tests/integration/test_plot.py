"""``shardwise inspect --plot FILE.png`` and ``shard_map``: real stores written by shardwise, one
shard deleted behind the journal's back; the PNG is read back with matplotlib (its size is the
picture's, and the pixel at each shard's centre has that shard's colour); refusals leave no file
and the store byte-identical."""

from __future__ import annotations

import itertools
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import shardwise
from faultkit import BUCKET, moto_s3, snapshot
from shardwise.cli import main
from shardwise.cli.inspection import shard_map
from shardwise.core.picture import COLOURS

CASES = {  # shape, shards, inner chunks
    1: ((64,), (16,), (8,)),
    2: ((40, 60), (10, 20), (5, 10)),
    3: ((8, 40, 60), (2, 20, 20), (2, 10, 10)),
}


def data(ndim: int) -> np.ndarray:
    """Values in the first half along axis 0, the fill value (0) in the second."""
    shape = CASES[ndim][0]
    x = np.arange(np.prod(shape), dtype="f4").reshape(shape) + 1
    x[shape[0] // 2 :] = 0
    return x


def write_case(root: Path, ndim: int) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """An array whose second half along axis 0 is fill (not stored) and whose first shard file
    is deleted after the write recorded it: (stored shards, the missing one)."""
    shape, shards, chunks = CASES[ndim]
    shardwise.write_array(data(ndim), root, chunks=chunks, shards=shards, mode="w")
    gone = (0,) * ndim
    (root / "c" / "/".join(map(str, gone))).unlink()
    grid = [range(-(-n // s)) for n, s in zip(shape, shards, strict=True)]
    stored = [c for c in itertools.product(*grid) if c[0] < len(grid[0]) // 2 and c != gone]
    return stored, gone


def rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_inspect_plot_draws_stored_empty_and_missing_shards(
    ndim: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import matplotlib.image

    root, png = tmp_path / "a.zarr", tmp_path / "shards.png"
    stored, gone = write_case(root, ndim)
    assert main(["inspect", str(root), "--plot", str(png)]) == 0
    assert f"picture  {png}" in capsys.readouterr().out
    picture = shard_map(root).picture
    image = matplotlib.image.imread(png)
    assert image.shape == (picture.height, picture.width, 4)
    shape, shards, _ = CASES[ndim]
    grid = list(itertools.product(*(range(-(-n // s)) for n, s in zip(shape, shards, strict=True))))
    assert len(picture.rects) == len(grid)
    for coord, rect in zip(grid, picture.rects, strict=True):
        want = "missing" if coord == gone else "stored" if coord in stored else "empty"
        assert rect.state == want, coord
        pixel = image[int(rect.y + rect.h / 2), int(rect.x + rect.w / 2), :3]
        np.testing.assert_allclose(pixel, rgb(COLOURS[want]), atol=0.02)


def test_shard_map_in_a_notebook_and_on_s3(tmp_path: Path) -> None:
    """The same picture from S3 (moto) as from local files; a notebook shows its SVG."""
    local = tmp_path / "a.zarr"
    write_case(local, 2)
    with moto_s3() as s3:
        store = s3.obstore("pic")
        shardwise.write_array(data(2), store, chunks=(5, 10), shards=(10, 20), mode="w")
        s3.client.delete_object(Bucket=BUCKET, Key="pic/c/0/0")
        remote = shard_map(store)
    here = shard_map(local)
    states = [r.state for r in remote.picture.rects]
    assert states == [r.state for r in here.picture.rects]
    assert states[0] == "missing" and {"stored", "empty"} < set(states)
    root = ET.fromstring(remote._repr_html_())
    assert root.tag == "div"


def test_plot_refusals_leave_the_store_and_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "g.zarr"
    x = np.ones((20, 20), dtype="f4")
    shardwise.write_array(x, root, path="a", chunks=(5, 5), shards=(10, 10), mode="w")
    before = snapshot(root)
    for bad, status, words in [
        (tmp_path / "out.txt", 2, "expected a file name ending in .png"),
        (tmp_path / "nowhere" / "out.png", 2, "no directory"),
        (tmp_path / "out.png", 3, "with one of its arrays: 'a'"),  # a group: name an array
    ]:
        if status == 2:  # bad usage: argparse exits before any store is opened
            with pytest.raises(SystemExit) as e:
                main(["inspect", str(root), "--plot", str(bad)])
            assert e.value.code == 2
        else:
            assert main(["inspect", str(root), "--plot", str(bad)]) == status
        assert words in capsys.readouterr().err
        assert not bad.exists()
    assert snapshot(root) == before
    assert main(["inspect", str(root), "--path", "a", "--plot", str(tmp_path / "a.png")]) == 0


def test_plot_without_matplotlib_is_refused_before_the_store_is_read(tmp_path: Path) -> None:
    root, png = tmp_path / "a.zarr", tmp_path / "a.png"
    write_case(root, 2)
    before = snapshot(root)
    # a fresh interpreter in which matplotlib cannot be imported
    code = (
        "import sys; sys.modules['matplotlib'] = None; "
        "from shardwise.cli import main; "
        f"sys.exit(main(['inspect', {str(root)!r}, '--plot', {str(png)!r}]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 3
    assert "DependencyError: --plot draws with matplotlib" in run.stderr
    assert "pip install matplotlib" in run.stderr
    assert not png.exists() and snapshot(root) == before
