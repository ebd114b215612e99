"""What the report's figures share (`figures`, `lineage_figures`): plotly loaded when a
figure is made, a figure of one note, a note in an empty subplot, the colours of the states."""

from __future__ import annotations

from typing import Any

COLOURS = {"COMPLETE": "#2ca02c", "PRUNED": "#ff7f0e", "FAIL": "#d62728", "RUNNING": "#1f77b4",
           "WAITING": "#7f7f7f"}


def go() -> Any:
    """`plotly.graph_objects`, imported on first use (the CLI starts without it)."""
    import plotly.graph_objects as graph_objects

    return graph_objects


def empty(title: str, note: str) -> Any:
    """A figure of one sentence: why there is nothing to draw."""
    fig = go().Figure()
    fig.add_annotation(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 14})
    fig.update_layout(title=title, xaxis={"visible": False}, yaxis={"visible": False},
                      height=300)
    return fig


def note(fig: Any, text: str, axis: str, shared_x: bool = False) -> None:
    """Say in the subplot of x-axis `axis` ("x2") why it is empty (no ticks of a scale that
    means nothing: a -1..1 of no data; the x-axis's stay when other subplots share it)."""
    n = axis[1:]
    fig.add_trace(go().Scatter(x=[None], y=[None], xaxis=axis, yaxis=f"y{n}", showlegend=False,
                               hoverinfo="skip"))  # plotly draws no subplot without a trace
    fig.add_annotation(text=text, showarrow=False, xref=f"{axis} domain",
                       yref=f"y{n} domain", x=0.5, y=0.5, font={"color": "#555"})
    blank = {"showticklabels": False, "showgrid": False, "zeroline": False}
    fig.update_layout({f"yaxis{n}": blank, **({} if shared_x else {f"xaxis{n}": blank})})
