"""The server's CPU over a level, from /proc (bench_serving.py): its own process, its encoder
processes (--encode-processes) and all its children (aligner workers too). Only where the tool
started the server, or was given its pid; None elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` (all its threads), from /proc/<pid>/stat."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of the live child processes of `pid`, recursively (the aligner
    workers and the encoder processes), from /proc/<pid>/task/*/children; None where /proc has no such process."""
    if pid is None or not Path(f"/proc/{pid}/task").is_dir():
        return None
    total, stack = 0.0, [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
            children = [int(c) for task in tasks for c in (task / "children").read_text().split()]
        except OSError:  # it ended meanwhile
            continue
        for child in children:
            stack.append(child)
            total += process_cpu_s(child) or 0.0
    return total


ENCODER_PROCESS_MODULE = "higgs_serve.audio.encode_worker"  # the server's encoder processes


def encoder_children(pid: int | None) -> list[int]:
    """The server's encoder processes (--encode-processes): its direct children running
    ENCODER_PROCESS_MODULE, found by scanning /proc (a front end's replicas are children too,
    and their own encoder processes grandchildren: neither is counted)."""
    if pid is None:
        return []
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and ENCODER_PROCESS_MODULE in (stat.parent / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    return sorted(found)


def children_cpu_s(pids: list[int]) -> dict[int, float]:
    return {pid: cpu for pid in pids if (cpu := process_cpu_s(pid)) is not None}


def server_cpu_metrics(cpu_before: float | None, cpu_after: float | None, window_s: float,
                       audio_s: float, children_before: dict[int, float] | None = None,
                       children_after: dict[int, float] | None = None) -> dict:
    """The server process's own CPU, and with its encoder processes' (children_*: pid -> CPU s;
    a process present at both ends counts; one replaced mid-level is left out)."""
    children_before, children_after = children_before or {}, children_after or {}
    if cpu_before is None or cpu_after is None or window_s <= 0:
        return {"server_cpu_cores": None, "server_cpu_ms_per_audio_s": None,
                "encoder_processes": None, "server_and_encoders_cpu_cores": None,
                "server_and_encoders_cpu_ms_per_audio_s": None}
    cpu = cpu_after - cpu_before
    kids = sum(children_after[pid] - children_before[pid]
               for pid in children_after if pid in children_before)
    return {"server_cpu_cores": cpu / window_s,
            "server_cpu_ms_per_audio_s": 1e3 * cpu / audio_s if audio_s else None,
            "encoder_processes": len(children_after),
            "server_and_encoders_cpu_cores": (cpu + kids) / window_s,
            "server_and_encoders_cpu_ms_per_audio_s": 1e3 * (cpu + kids) / audio_s if audio_s else None}
