"""Reading a study back: `summary` (trials and GPU use as DataFrames, CSV, a table),
`figures` (plotly figures) and `report` (one offline HTML file). `summary` and `figures` are
public. Imports `_core`, `spec`, `gpus`, `trial`, `study` and `schedulers` (its pure modules:
a scheduler's rungs, the lineages' histories); never `runner`."""
