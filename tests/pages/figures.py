"""Read the plotly figures a page drew under AppTest (AppTest has no plotly accessor of its own)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
from streamlit.testing.v1 import AppTest


def values(data: Any) -> list[Any]:
    """A trace's array as a list: plotly ≥ 6 sends numeric arrays as `{"dtype", "bdata"}` base64."""
    if isinstance(data, dict) and "bdata" in data:
        array = np.frombuffer(base64.b64decode(data["bdata"]), dtype=np.dtype(data["dtype"]))
        return array.reshape(data["shape"]).tolist() if "shape" in data else array.tolist()
    return list(data)


def figures(at: AppTest) -> list[dict[str, Any]]:
    """Every plotly chart of the last run as plotly JSON (`data`, `layout`), in page order."""
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def figure_titled(at: AppTest, title: str) -> dict[str, Any]:
    """The one chart whose title starts with `title`."""
    found = [f for f in figures(at) if str(f["layout"].get("title", {}).get("text", "")).startswith(title)]
    assert len(found) == 1, f"{len(found)} charts titled {title!r}"
    return found[0]
