"""Plot helpers shared by the HTML reports: matplotlib figures embedded as data URIs (no network needed)."""

from __future__ import annotations

import base64
import io
from typing import Any


def new_figure(width: float = 9.0, height: float = 3.2) -> tuple[Any, Any]:
    """A matplotlib figure and axes drawn off-screen (Agg), whatever the user's backend is."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot(1, 1, 1)


def figure_to_data_uri(fig: Any, fmt: str = "png") -> str:
    """Render `fig` into a `data:image/png;base64,...` URI for an <img src=...> tag."""
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    mime = "image/svg+xml" if fmt == "svg" else f"image/{fmt}"
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")
