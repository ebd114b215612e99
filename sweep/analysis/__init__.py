"""Reading a study back: `summary` (trials and GPU use as DataFrames, CSV, a table),
`figures` (plotly figures) and `report` (one offline HTML file). `summary` and `figures` are
public. Imports `_core`, `spec`, `gpus`, `trial`, `study` and `runner` (a scheduler's rungs, pure);
never runs a trial."""
