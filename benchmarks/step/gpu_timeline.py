"""What the GPU did over a traced span: busy time (the union of every kernel and copy), each
stream's own busy time, how much the streams ran at once, and the idle gaps, from a Chrome trace
that torch.profiler exported (`torch.profiler.profile(activities=[CUDA]).export_chrome_trace`).

A serving engine whose two stages take turns on the GPU shows busy ≈ the sum of the streams'
times and little overlap; an engine held back by its host shows idle gaps.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections import defaultdict
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
GAP_BINS_US = (10, 100, 1000)  # idle gaps are counted as < 10 µs, 10–100, 100–1000, >= 1000


def _gaps(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Idle intervals (start, end) between the union's pieces."""
    gaps, end = [], None
    for a, b in sorted(spans):
        if end is not None and a > end:
            gaps.append((end, a))
        end = b if end is None else max(end, b)
    return gaps


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Time covered by at least one span: their extent less the idle gaps inside it."""
    if not spans:
        return 0.0
    extent = max(b for _, b in spans) - min(a for a, _ in spans)
    return extent - sum(b - a for a, b in _gaps(spans))


def _where(t: float, start: float, span: float) -> str:
    return f"{(t - start) / 1e3:.1f} ms ({100 * (t - start) / span:.0f} %)"


def _label(event: dict) -> str:
    return f"{event.get('args', {}).get('stream', '?')}:{event.get('name', '?')[:50]}"


def gpu_events(trace: dict) -> list[dict]:
    """The device-side events (kernels, copies, memsets) of a Chrome trace dict."""
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]


def summarize(events: list[dict], top: int = 5, middle: float = 0.8) -> dict:
    """Busy / overlap / gaps over the span of `events` (each with ts, dur in µs and args.stream),
    the busy fraction of the `middle` part of the span alone (the steady state, away from a
    run's start and drain), and the `top` longest idle gaps with the kernels on either side."""
    if not events:
        return {"events": 0}
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    by_stream: dict[str, list[tuple[float, float]]] = defaultdict(list)
    names: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e, span in zip(events, spans):
        stream = str(e.get("args", {}).get("stream", "?"))
        by_stream[stream].append(span)
        names[stream][e.get("name", "?")[:60]] += span[1] - span[0]
    gap_spans = _gaps(spans)
    gaps = [b - a for a, b in gap_spans]
    busy = (end - start) - sum(gaps)  # as _union_us, from the gaps needed below anyway
    streams = {}
    for stream, s in sorted(by_stream.items(), key=lambda kv: -sum(b - a for a, b in kv[1])):
        heavy = sorted(names[stream].items(), key=lambda kv: -kv[1])[:top]
        streams[stream] = {"events": len(s), "busy_ms": _union_us(s) / 1e3,
                           "top_ms": {name: round(us / 1e3, 3) for name, us in heavy}}
    edges = (0.0, *GAP_BINS_US, float("inf"))
    bins = {f"{lo:g}-{hi:g}us": {"count": sum(lo <= g < hi for g in gaps),
                                 "ms": sum(g for g in gaps if lo <= g < hi) / 1e3}
            for lo, hi in zip(edges, edges[1:])}
    lo, hi = start + (1 - middle) / 2 * (end - start), end - (1 - middle) / 2 * (end - start)
    inner = [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]
    by_end = sorted(range(len(spans)), key=lambda i: spans[i][1])
    by_start = sorted(range(len(spans)), key=lambda i: spans[i][0])
    end_times = [spans[i][1] for i in by_end]
    start_times = [spans[i][0] for i in by_start]
    longest = []
    for a, b in sorted(gap_spans, key=lambda g: g[0] - g[1])[:top]:
        before = events[by_end[bisect_right(end_times, a) - 1]]  # a gap starts where a span ended
        after = events[by_start[bisect_left(start_times, b)]]  # and ends where one starts
        longest.append({"at": _where(a, start, end - start), "ms": (b - a) / 1e3,
                        "before": _label(before), "after": _label(after)})
    stream_sum = sum(v["busy_ms"] for v in streams.values())
    return {"events": len(events), "span_ms": (end - start) / 1e3, "busy_ms": busy / 1e3,
            "busy_fraction": busy / (end - start) if end > start else 1.0,
            f"busy_fraction_middle_{middle:g}": _union_us(inner) / (hi - lo) if hi > lo else 1.0,
            "streams_sum_ms": stream_sum, "overlap_ms": stream_sum - busy / 1e3,
            "idle_gaps": bins, "longest_gaps": longest, "streams": streams}


def summarize_file(path: str | Path, top: int = 5) -> dict:
    return summarize(gpu_events(json.loads(Path(path).read_text())), top)
