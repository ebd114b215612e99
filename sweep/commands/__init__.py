"""The verbs of the command line and what they do; `assembly` puts a run together around the
driver (also `sweep.run`).

Imports _core, spec, gpus, trial, study, runner and analysis.
"""
