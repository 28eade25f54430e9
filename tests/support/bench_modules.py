"""Import a script of benchmarks/ (not a package) as a module, once per test session."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def load_bench(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `_bench_<name>`."""
    module_name = f"_bench_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
