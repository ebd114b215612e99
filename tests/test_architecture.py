"""Imports go one way: a module imports only from the layers below its own."""

from __future__ import annotations

import ast
from pathlib import Path

import sweep

LAYERS = [
    {"errors", "protocol", "guard", "nvml", "events", "yamlfile", "safefs", "hang",
     "grpclock", "placement", "sqlite", "terminal", "optuna_compat", "ownership", "interpreter"},
    {"storageurl", "searchspace", "placeholders", "health", "stacks", "accelconfig"},
    {"config", "hostlock", "lineage"},
    {"sicklist"},
    {"trialdir"},
    {"launch", "outcome", "policy", "pool", "warm", "storage", "studies", "reportsources"},
    {"budget", "heartbeat", "provenance"},
    {"process", "monitor", "store", "proxy", "accelenv"},
    {"launchers"},
    {"driver"},
    {"progress", "summary"},
    {"figures"},
    {"report"},
    {"app"},
    {"cli"},
    {"__main__"},
]


def sweep_imports(path: Path) -> set[str]:
    """The sweep modules that `path` imports (TYPE_CHECKING-only imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sweep"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("sweep.")}
    return found - {"testing", "__version__"}


def test_imports_go_one_way():
    layer_of = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    package = Path(sweep.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
    assert modules == set(layer_of), "a module without a layer: place it in LAYERS"
    upward = []
    for name in modules:
        for imported in sweep_imports(package / f"{name}.py") - {name}:
            if layer_of[imported] >= layer_of[name]:
                upward.append(f"{name} -> {imported}")
    assert not upward, upward
