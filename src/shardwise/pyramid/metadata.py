"""OME-Zarr 0.5 metadata of a pyramid: the group's ``zarr.json`` with its ``ome`` attributes
(axes with their types and units, one dataset per level with its scale and translation).

>>> from shardwise.core.pyramid import pyramid_levels
>>> attrs = ome_attributes(("y", "x"), pyramid_levels((4, 4), (2, 2), 2, centered=True),
...                        "mean", units={"x": "micrometer"})
>>> attrs["ome"]["multiscales"][0]["axes"]
[{'name': 'y', 'type': 'space'}, {'name': 'x', 'type': 'space', 'unit': 'micrometer'}]
>>> attrs["ome"]["multiscales"][0]["datasets"][1]["coordinateTransformations"]
[{'type': 'scale', 'scale': [2.0, 2.0]}, {'type': 'translation', 'translation': [0.5, 0.5]}]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.pyramid import AXIS_TYPES, Level

__all__ = ["OME_VERSION", "group_document", "ome_attributes"]

OME_VERSION = "0.5"
# what each method is, in the words of the multiscales "type" field (free text in 0.5)
_TYPES = {"mean": "mean", "nearest": "nearest", "mode": "mode"}


def ome_attributes(
    axes: Sequence[str],
    levels: Sequence[Level],
    method: str,
    *,
    units: Mapping[str, str] | None = None,
    name: str | None = None,
    paths: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The group attributes of an OME-Zarr 0.5 image of ``levels`` (paths "0", "1", ...)."""
    units = units or {}
    ax: list[dict[str, Any]] = []
    for a in axes:
        entry: dict[str, Any] = {"name": a, "type": AXIS_TYPES[a]}
        if a in units:
            entry["unit"] = units[a]
        ax.append(entry)
    datasets = [
        {
            "path": paths[i] if paths else str(i),
            "coordinateTransformations": [
                {"type": "scale", "scale": list(lv.scale)},
                {"type": "translation", "translation": list(lv.translation)},
            ],
        }
        for i, lv in enumerate(levels)
    ]
    multiscale: dict[str, Any] = {"axes": ax, "datasets": datasets, "type": _TYPES[method]}
    if name is not None:
        multiscale["name"] = name
    multiscale["metadata"] = {"method": f"shardwise.write_pyramid({method!r})"}
    return {"ome": {"version": OME_VERSION, "multiscales": [multiscale]}}


def group_document(attributes: Mapping[str, Any]) -> bytes:
    """A Zarr v3 group's ``zarr.json`` carrying ``attributes``."""
    doc = {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes)}
    return json.dumps(doc, indent=2).encode()


def put_group(store: Any, key: str, attributes: Mapping[str, Any]) -> None:
    """Store a group's ``zarr.json`` (:func:`group_document`) at ``key`` of ``store`` (a
    ``ShardStore``) unless it is stored already (with the consolidated metadata a finish
    adds after it, or not): a resume of a finished pyramid leaves it as it was."""
    doc = group_document(attributes)
    stored = store.get(key)
    if stored is not None:
        try:
            have = json.loads(stored)
        except ValueError:
            have = None
        if isinstance(have, dict):
            have.pop("consolidated_metadata", None)
            if have == json.loads(doc):
                return
    store.put(key, doc)
