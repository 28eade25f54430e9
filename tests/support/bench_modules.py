"""Import a script of benchmarks/<group>/ (not a package) as a module, once per test session."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def bench_path(name: str) -> Path:
    """benchmarks/<group>/<name>.py (script names are unique across the groups), or
    benchmarks/<name>.py for the shared helpers (common, plot, speech_clips)."""
    found = sorted(BENCH_DIR.glob(f"{name}.py")) + sorted(BENCH_DIR.glob(f"*/{name}.py"))
    if len(found) != 1:
        raise LookupError(f"benchmarks script {name!r}: found {[str(p) for p in found]}")
    return found[0]


def load_bench(name: str) -> ModuleType:
    """The benchmark script `name` as the module `_bench_<name>`."""
    module_name = f"_bench_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, bench_path(name))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
