"""Fakes that ship with sweep so its tests (and yours) run without a GPU."""
