"""Helpers shared by the benchmark tools: provenance (command, commit, device), percentiles,
JSON output, markdown tables and cProfile listings. Standard library + numpy only, so the HTTP client
(bench_serving) never needs torch.
"""

from __future__ import annotations

import collections
import cProfile
import io
import json
import os
import platform
import pstats
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def command_line(script: str | None = None, argv: list[str] | None = None) -> str:
    """The exact invocation, shell-quoted, so a result file says how to reproduce it. A tool's
    main called in-process with its own argv (tests) passes its script and argv, so the record
    names the tool and its flags rather than the caller's command line."""
    args = sys.argv if argv is None else [script or sys.argv[0], *argv]
    return shlex.join([Path(sys.executable).name, *args])


def git_commit() -> str:
    """HEAD of the repo the tools live in, "+dirty" when the tree has changes; "unknown" when
    there is no git (the GPU machine gets a copy of the tree, possibly without .git). The
    HIGGS_GIT_COMMIT environment variable, set by whoever copied the tree there, wins."""
    if os.environ.get("HIGGS_GIT_COMMIT"):
        return os.environ["HIGGS_GIT_COMMIT"]
    if shutil.which("git") is None:
        return "unknown"
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def nvidia_smi(query: str, what: str = "gpu") -> list[str] | None:
    """One CSV line per GPU (or per `what`: "compute-apps" lists the processes on the GPUs) for
    `--query-{what}=query`, or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{what}={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def gpu_memory_used_mib() -> list[int] | None:
    """Memory in use per GPU (MiB), as nvidia-smi reports it (all processes)."""
    lines = nvidia_smi("memory.used")
    if lines is None:
        return None
    return [int(float(line)) for line in lines]


def device_description() -> dict:
    """What the numbers were measured on: GPUs from nvidia-smi when present, plus the host."""
    gpus = nvidia_smi("name,memory.total,driver_version")
    return {
        "gpus": gpus or [],
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }


def provenance(tool: str, started_at: str) -> dict:
    """The head of a result file: the tool, how it was run, at which commit, on what, and when
    (finished now)."""
    return {"tool": tool, "command": command_line(), "git_commit": git_commit(), "device": device_description(),
            "started_at": started_at, "finished_at": now_iso()}


def percentile(values: Sequence[float], q: float) -> float | None:
    """q-th percentile (0..100, linear interpolation); None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def write_json(path: str | Path, payload: dict) -> None:
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 0.01 and value != 0 else f"{value:.2f}"
    return str(value)


def markdown_table(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> str:
    """rows: dicts; columns: (key, header). Missing or None cells print as "-"."""
    header = "| " + " | ".join(h for _, h in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(row.get(key)) for key, _ in columns) + " |" for row in rows]
    return "\n".join([header, rule, *body])


def profile_listing(prof: cProfile.Profile, top: int, cumulative: bool = True) -> str:
    """A cProfile's `top` functions by own time and, with `cumulative`, by cumulative time."""
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    if cumulative:
        stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


class PhaseTimer:
    """A profiling hook for the engine loop (`EngineHooks.profile`, engine/core.py): the seconds
    spent in the `timed` phases (in all, and per phase with its count), the (start, end) of every
    "step", and, while `profiler` is set, that cProfile enabled around each step. Other phases
    cost one dict lookup. `add` counts time measured elsewhere as a phase of its own."""

    def __init__(self, timed: Sequence[str] = ()):
        self.seconds = 0.0  # in the timed phases since the last reset
        self.by_phase: dict[str, float] = collections.defaultdict(float)  # the same, per phase
        self.calls: collections.Counter = collections.Counter()  # times each timed phase ran
        self.spans: list[tuple[float, float]] = []  # every step's (start, end), perf_counter
        self.profiler: cProfile.Profile | None = None
        self._spans = {phase: _PhaseSpan(self, phase, timed=True) for phase in timed}
        self._spans["step"] = _PhaseSpan(self, "step", timed="step" in timed, step=True)
        self._untimed = _PhaseSpan(self, "", timed=False)

    def __call__(self, phase: str) -> "_PhaseSpan":
        return self._spans.get(phase, self._untimed)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds += seconds
        self.by_phase[phase] += seconds
        self.calls[phase] += 1

    def reset(self) -> None:
        self.seconds, self.spans = 0.0, []
        self.by_phase.clear()
        self.calls.clear()


class _PhaseSpan:
    """One phase's context manager; a phase never nests in itself, so one object serves all calls."""

    def __init__(self, timer: PhaseTimer, phase: str, timed: bool, step: bool = False):
        self.timer, self.phase, self.timed, self.step = timer, phase, timed, step
        self.t0 = 0.0

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        if self.step and self.timer.profiler is not None:
            self.timer.profiler.enable()

    def __exit__(self, *exc) -> None:
        t1 = time.perf_counter()
        if self.step:
            if self.timer.profiler is not None:
                self.timer.profiler.disable()
            self.timer.spans.append((self.t0, t1))
        if self.timed:
            self.timer.add(self.phase, t1 - self.t0)
