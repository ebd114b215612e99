"""Reading a study back: `summary` (trials and GPU use as DataFrames, CSV, a table),
`figures` (plotly figures) and `report` (one offline HTML file). `summary` and `figures` are
public. Imports `_core`, `spec`, `gpus`, `trial`, `study` and `schedulers` (its pure modules:
a scheduler's rungs, the lineages' histories); never `runner`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face

if TYPE_CHECKING:
    from sweep.analysis.status import Status
    from sweep.analysis.summary import Summary, load

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
