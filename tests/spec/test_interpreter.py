"""The interpreter probe's answer of which distributions provide a script's modules."""

from __future__ import annotations

import sys
from importlib import metadata

from sweep.spec import interpreter

# a module of its distribution's name (torch, numpy), one of another name (yaml: PyYAML), a
# single-file module (typing_extensions.py), a namespace package (google, from protobuf), an
# editable install (sweep), and one nothing provides
MODULES = ["torch", "numpy", "yaml", "typing_extensions", "google", "sweep", "no_such_module"]


def test_the_distributions_named_are_those_the_full_scan_finds():
    """The probe takes the distribution of the module's own name when its files hold the
    module, and scans every distribution otherwise: the answer is the scan's."""
    found = interpreter.probe(sys.executable, modules=MODULES).modules
    scan = metadata.packages_distributions()
    expected = {dist: metadata.version(dist) for module in MODULES
                for dist in scan.get(module, [])}
    assert found == expected
    assert {"torch", "numpy", "PyYAML", "typing_extensions", "sweep"} <= set(found)
