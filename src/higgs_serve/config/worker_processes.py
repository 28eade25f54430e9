"""The server's worker processes (encoders, aligners): where they run, and that they end with
the server (docs/operations.md#worker-processes).

The engine's process makes the audio; every step it is late delays every stream. Its worker
processes (encoders, aligners) do work that can wait a few milliseconds, so they run at a lower
priority (`nice`, added to the server's own) and, on a host with cores to spare, on a CPU set
that leaves the engine's cores alone:

    worker_cpus "auto"  the server's cores less the first `reserved` of them, when that leaves
                        at least `reserved` for the workers; otherwise every core (a small or CI
                        host: the workers share, at the lower priority)
                "all"   every core the server may use
                "2-7,12" those cores (a subset of the server's)

Validated once (`WorkerPlacement.resolve`, ConfigError naming the setting); a worker applies
it to itself as its first act (`apply_here`), before it starts a thread, so every thread it
makes inherits it. Its second is `end_with_parent`: a worker never outlives its server. Both
kinds are started the same way: `spawn_worker` in the server (one end of a socket pair, the
server's pid, the placement on the command line), `worker_start` as the worker's first lines.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

from higgs_serve.errors import ConfigError

MAX_NICE = 19  # the kernel's lowest priority
# A worker that owes an answer and gives none for this long (plus an allowance per second of
# audio in its work: encoder_process.py, aligner_process.py) is killed and replaced: 200x the
# costliest 1 s encoder chunk and ~10x the longest sentence's alignment measured
# (docs/operations.md#worker-processes). ServerSettings.worker_timeout_s.
DEFAULT_WORKER_TIMEOUT_S = 10.0
DEFAULT_WORKER_NICE = 10  # ServerSettings.worker_nice: the workers yield to the engine's process
_PR_SET_PDEATHSIG = 1


def server_cpus() -> frozenset[int]:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def parse_cpu_list(text: str) -> frozenset[int]:
    """"0-3,8" -> {0, 1, 2, 3, 8}; ValueError for anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part.strip()!r} is not a core number or range")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"{part.strip()!r} is an empty range")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int]) -> str:
    """{0, 1, 2, 3, 8} -> "0-3,8" (parse_cpu_list's inverse)."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


@dataclass(frozen=True)
class WorkerPlacement:
    cpus: frozenset[int] | None  # None: every core the server may use
    nice: int  # added to the server's niceness (capped at MAX_NICE by the kernel)

    @classmethod
    def resolve(cls, cpus_spec: str, nice: int, reserved: int,
                available: frozenset[int] | None = None) -> WorkerPlacement:
        """The placement for `worker_cpus` = cpus_spec ("auto", "all" or a core list) on a
        server that may use `available` cores (default: its affinity), keeping `reserved`
        cores for the engine's process under "auto". ConfigError for a bad value."""
        if not 0 <= nice <= MAX_NICE:
            raise ConfigError(f"server setting worker_nice must be 0-{MAX_NICE}, got {nice}")
        available = server_cpus() if available is None else available
        spec = cpus_spec.strip().lower()
        if spec == "all":
            return cls(None, nice)
        if spec == "auto":
            ordered = sorted(available)
            spare = ordered[reserved:]
            return cls(frozenset(spare) if len(spare) >= reserved > 0 else None, nice)
        try:
            cpus = parse_cpu_list(spec)
        except ValueError as error:
            raise ConfigError(f"server setting worker_cpus must be 'auto', 'all' or a core list "
                              f"such as '2-7,12': {error}") from None
        outside = cpus - available
        if outside:
            raise ConfigError(f"server setting worker_cpus names cores this server may not use: "
                              f"{format_cpu_list(frozenset(outside))} (it may use "
                              f"{format_cpu_list(available)})")
        return cls(cpus, nice)

    def describe(self) -> str:
        cores = "every core" if self.cpus is None else f"cores {format_cpu_list(self.cpus)}"
        return f"{cores}, nice +{self.nice}"

    def to_args(self) -> list[str]:
        """The command-line form a worker process reads back with `from_args`."""
        return ["--nice", str(self.nice), "--cpus", "all" if self.cpus is None else format_cpu_list(self.cpus)]

    @classmethod
    def from_args(cls, nice: int, cpus: str) -> WorkerPlacement:
        return cls(None if cpus == "all" else parse_cpu_list(cpus), nice)

    def apply_here(self) -> None:
        """In the worker process: lower the priority of each of its threads and pin them (on
        Linux both are per thread; a thread started later inherits them from its starter).
        Threads already there (NumPy's BLAS pool, started at import) are included."""
        for tid in _threads():
            if self.nice:
                current = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, current + self.nice))
            if self.cpus is not None and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(tid, self.cpus)


def _threads() -> list[int]:
    """This process's thread ids (just itself where /proc is missing)."""
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except FileNotFoundError:
        return [0]


NO_PLACEMENT = WorkerPlacement(None, 0)  # a worker that runs like the server (tests, tools)


def end_with_parent(parent_pid: int) -> None:
    """In a worker: SIGTERM it when the thread that started it (in the server) ends, and end now
    if the server is already gone (it died before the worker got here)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        sys.exit(0)


def spawn_worker(module: str, placement: WorkerPlacement) -> tuple[subprocess.Popen, socket.socket]:
    """`python -m module` given one end of a new Unix socket pair, this process's pid and
    `placement` (its `worker_start` reads them); returns the process and the server's end. Call
    it from a thread that lives as long as the server: the worker's PR_SET_PDEATHSIG watches it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", module, "--fd", str(theirs.fileno()), "--parent-pid", str(os.getpid()),
             *placement.to_args()],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


def worker_start(module: str, argv: list[str] | None = None) -> int:
    """A worker's first act (module note): its arguments read, its placement applied, bound to
    the server's life, SIGINT left to the server (it says when to stop: EOF); returns the file
    descriptor of the worker's end of the socket pair."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--fd", type=int, required=True, help="this process's end of the socket pair")
    parser.add_argument("--parent-pid", type=int, required=True, help="the server's pid")
    parser.add_argument("--nice", type=int, default=0, help="added to the server's niceness")
    parser.add_argument("--cpus", default="all", help="the cores to run on ('all' or a list)")
    args = parser.parse_args(argv)
    WorkerPlacement.from_args(args.nice, args.cpus).apply_here()
    end_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return args.fd
