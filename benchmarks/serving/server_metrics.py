"""What the server says about itself over a level (bench_serving.py): two scrapes of its
/metrics, before and after, and what grew between them.

Named series give the Stage 0 step, the server's own TTFA, the codec's batching, the watermark
stage, word timestamps' alignment and how the steps ran. Beyond those, every series whose family
name speaks of playback (PLAYBACK_WORDS: stalls as the server sees them, slack, queue wait,
underruns, admission, refusals) is recorded as it comes, without naming it here: counters as
their growth over the level, gauges as their value at its end, histograms as their count, mean
and p50/p95/p99 estimated from the buckets' growth (Prometheus' histogram_quantile rule). A
server without such series records none.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import mean, percentile  # noqa: E402

ENGINE_SERIES = ("higgs_serve_stage0_step_seconds_sum", "higgs_serve_stage0_step_seconds_count",
                 "higgs_serve_stage0_rows_total")
# The server's own TTFA (request arrival to first chunk): beside the client's TTFA it tells time
# spent in the server from time spent in the client and on the wire.
SERVER_TTFA_SERIES = ("higgs_serve_ttfa_seconds_sum", "higgs_serve_ttfa_seconds_count")
# Stage 1's batching: windows per codec call, and how much of the level the codec thread decoded.
CODEC_SERIES = ("higgs_serve_codec_calls_total", "higgs_serve_codec_windows_total",
                "higgs_serve_codec_graph_calls_total", "higgs_serve_codec_busy_seconds_total")
# How Stage 0's steps ran (step mode; for eager steps, launch tape or not): a level slower than the
# step benchmarks shows here whether its steps took the graphs and tapes they were measured with.
STEP_MODES = ("full", "piecewise", "local_mlp", "none")
EAGER_OUTCOMES = ("replay", "recorded", "void", "op_by_op")
STEP_KIND_SERIES = {**{f"stage0_steps_{m}": f'higgs_serve_stage0_steps_total{{mode="{m}"}}' for m in STEP_MODES},
                    **{f"eager_steps_{o}": f'higgs_serve_eager_steps_total{{outcome="{o}"}}' for o in EAGER_OUTCOMES}}
# The watermark stage (engine/mark_stage.py), present when the server marks audio.
WATERMARK_SERIES = ("higgs_serve_watermark_calls_total", "higgs_serve_watermark_chunks_total",
                    "higgs_serve_watermark_audio_seconds_total", "higgs_serve_watermark_busy_seconds_total")
# Word timestamps (server/last_mile/word_timestamps.py): a sentence's wait for its words, and failures.
ALIGNMENT_SERIES = ("higgs_serve_alignment_seconds_sum", "higgs_serve_alignment_seconds_count",
                    "higgs_serve_alignment_failures_total")


def counter_deltas(before: dict[str, float], after: dict[str, float], series: tuple[str, ...]) -> tuple | None:
    """How much each of `series` grew between two scrapes (None if either scrape lacks one)."""
    if not all(name in before and name in after for name in series):
        return None
    return tuple(after[n] - before[n] for n in series)


def engine_step_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    """Mean Stage 0 step wall time and rows per step over a level, from two /metrics scrapes."""
    deltas = counter_deltas(before, after, ENGINE_SERIES)
    if deltas is None:
        return {"engine_steps": None, "engine_step_ms_mean": None, "engine_rows_per_step": None}
    seconds, steps, rows = deltas
    return {"engine_steps": int(steps), "engine_step_ms_mean": 1e3 * seconds / steps if steps else None,
            "engine_rows_per_step": rows / steps if steps else None}


def server_ttfa_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    """Mean server-side TTFA over a level, from two /metrics scrapes (None without them)."""
    deltas = counter_deltas(before, after, SERVER_TTFA_SERIES)
    if deltas is None:
        return {"server_ttfa_ms_mean": None}
    seconds, count = deltas
    return {"server_ttfa_ms_mean": 1e3 * seconds / count if count else None}


def step_kind_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    """Stage 0 steps of a level per step mode, and its eager steps per launch-tape outcome (None
    where the server does not export the series)."""
    return {key: int(after[name] - before[name]) if name in before and name in after else None
            for key, name in STEP_KIND_SERIES.items()}


def codec_metrics(before: dict[str, float], after: dict[str, float], window_s: float) -> dict:
    """Stage 1 over a level, from two /metrics scrapes: windows per call, the share of calls that
    replayed a graph, and the codec thread's busy fraction of the window (None without them)."""
    deltas = counter_deltas(before, after, CODEC_SERIES)
    if deltas is None:
        return {"codec_windows_per_call": None, "codec_graph_call_fraction": None, "codec_busy_fraction": None}
    calls, windows, graph_calls, busy = deltas
    return {"codec_windows_per_call": windows / calls if calls else None,
            "codec_graph_call_fraction": graph_calls / calls if calls else None,
            "codec_busy_fraction": busy / window_s if window_s > 0 else None}


def watermark_metrics(before: dict[str, float], after: dict[str, float], window_s: float) -> dict:
    """The mark stage over a level: its busy fraction of the window, chunks per call, and busy
    milliseconds per second of audio it marked (None when the server does not mark)."""
    deltas = counter_deltas(before, after, WATERMARK_SERIES)
    if deltas is None:
        return {"watermark_busy_fraction": None, "watermark_chunks_per_call": None,
                "watermark_busy_ms_per_audio_s": None}
    calls, chunks, audio_s, busy = deltas
    return {"watermark_busy_fraction": busy / window_s if window_s > 0 else None,
            "watermark_chunks_per_call": chunks / calls if calls else None,
            "watermark_busy_ms_per_audio_s": 1e3 * busy / audio_s if audio_s else None}


def alignment_metrics(before: dict[str, float], after: dict[str, float], records: Sequence) -> dict:
    """Word timestamps over a level: the client's lag from the last audio to the last words
    event, words received, and the server's alignment wait and failures (None when not asked)."""
    timed = [r for r in records if r.ok and r.words_at is not None and r.arrivals]
    lag = [1e3 * (r.words_at - r.arrivals[-1][0]) for r in timed]
    deltas = counter_deltas(before, after, ALIGNMENT_SERIES)
    seconds, count, failures = deltas if deltas is not None else (None, None, None)
    return {"words_events_requests": len(timed), "words_per_request_mean": mean([r.words for r in timed]),
            "words_lag_ms_p50": percentile(lag, 50), "words_lag_ms_p99": percentile(lag, 99),
            "server_alignment_ms_mean": 1e3 * seconds / count if count else None,
            "alignments": int(count) if count is not None else None,
            "alignment_failures": int(failures) if failures is not None else None}


# ------------------------------------------------------------------------------ any playback series
PLAYBACK_WORDS = ("stall", "slack", "queue_wait", "underrun", "admission", "refus", "capacity", "lead_tail",
                  "limit_changes")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


class Scrape(dict):
    """One /metrics scrape: {sample (name with its labels, as written): value}, and `types`
    {family: counter | gauge | histogram | ...} from its `# TYPE` lines."""

    def __init__(self, values: dict[str, float] | None = None, types: dict[str, str] | None = None):
        super().__init__(values or {})
        self.types = types or {}


def parse_exposition(text: str) -> Scrape:
    values, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) == 4:
                types[parts[2]] = parts[3]
        elif line and not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            try:
                values[sample.strip()] = float(value)
            except ValueError:
                continue
    return Scrape(values, types)


async def scrape_metrics(client: httpx.AsyncClient, url: str) -> Scrape:
    """The server's /metrics (empty when it has none: another server, or not reachable)."""
    try:
        response = await client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return Scrape()
    return parse_exposition(response.text) if response.status_code == 200 else Scrape()


def _family(sample: str, types: dict[str, str]) -> tuple[str, str, str]:
    """(family, kind, suffix) of a sample: from the `# TYPE` lines where they name it, else by
    its suffix (_bucket/_sum/_count: histogram; _total: counter; else gauge)."""
    name = sample.split("{", 1)[0]
    for suffix in (*HISTOGRAM_SUFFIXES, "_total"):
        base = name.removesuffix(suffix)
        if base != name and base in types:
            return base, types[base], suffix
    if name in types:
        return name, types[name], ""
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix), "histogram", suffix
    return name, "counter" if name.endswith("_total") else "gauge", ""


def _split_le(sample: str, suffix: str) -> tuple[str, float | None]:
    """A histogram sample's series (its family name and its labels but `le`), and its upper
    bound when it is a bucket."""
    name, _, labels = sample.partition("{")
    kept, bound = [], None
    for label in labels.rstrip("}").split(",") if labels else ():
        key, _, value = label.partition("=")
        if key.strip() == "le":
            bound = float(value.strip().strip('"'))
        else:
            kept.append(label)
    base = name.removesuffix(suffix)
    return (base + "{" + ",".join(kept) + "}") if kept else base, bound


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile (0..1) of cumulative (upper bound, count) buckets, interpolated linearly
    inside the bucket it falls in (from 0 for the first); the highest finite bound when it falls
    in the +Inf bucket; None for no observations."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lower, below = q * buckets[-1][1], 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def _grown(sample: str, before: dict[str, float], after: dict[str, float]) -> float:
    return after[sample] - before.get(sample, 0.0)


def playback_series(before: Scrape, after: Scrape) -> dict:
    """Every playback series (PLAYBACK_WORDS in its family name) over a level: {sample: growth}
    for counters, {sample: value at the end} for gauges, {histogram (labels but `le`):
    {count, mean, p50, p95, p99}} for histograms."""
    types = {**before.types, **after.types}
    out: dict = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for sample in sorted(after):
        family, kind, suffix = _family(sample, types)
        if not family.startswith("higgs_serve_") or not any(w in family for w in PLAYBACK_WORDS):
            continue
        if kind in ("histogram", "summary") and suffix:
            base, bound = _split_le(sample, suffix)
            entry = out.setdefault(base, {"count": None, "mean": None, "p50": None, "p95": None, "p99": None})
            if suffix == "_bucket" and bound is not None:
                buckets.setdefault(base, []).append((bound, _grown(sample, before, after)))
            else:
                entry[suffix[1:]] = _grown(sample, before, after)
        elif kind == "counter":
            out[sample] = _grown(sample, before, after)
        elif kind == "gauge":
            out[sample] = after[sample]
    for base, entry in out.items():
        if isinstance(entry, dict):
            total, count = entry.pop("sum", None), entry["count"]
            entry["mean"] = total / count if total is not None and count else None
            for q in (50, 95, 99):
                entry[f"p{q}"] = bucket_quantile(buckets.get(base, []), q / 100)
    return out
