"""End-to-end serving benchmark: the real HTTP server in a subprocess, closed-loop streaming
clients at several concurrencies, and what their listeners heard.

One server start per invocation (`python -m higgs_serve.cli serve MODEL ...`, ready when GET
/ready answers 200; serving/server_process.py), then for each level (a concurrency c and a
request variant, lowest c first): `--warmup` untimed requests before the first level, then
`--num-requests` measured ones from c closed-loop clients (each sends its next request as soon as
its last one finished; serving/stream_client.py). Every request streams raw 16-bit PCM over
chunked HTTP (`stream: true, stream_format: "audio", response_format: "pcm"`) and asks for
exactly N frames (`max_new_tokens = min_new_tokens = N`; random weights never stop on their own),
one seed each. `--no-stream-field` sends neither stream field, as OpenAI's clients do.
Production-like mixes: `--frames-spread s` draws each request's N from frames·(1 ± s), and
`--file-every k` makes every k-th request a whole-file one (`stream: false`).

Several variants on one server (serving/variants.py): `--variants pcm@1,16,64,256 mp3@256
pcm+sse+words@64` runs each variant (format, SSE, word timestamps) at its own levels, each level
an entry of its own (`variant` names it); `--response-format pcm mp3` is the same as `--variants
pcm mp3` at every `--concurrency` level.

Metrics (docs/model.md#metrics, the usual definitions):
- TTFA: client time from sending the request (its first try, when refused and retried) to the
  first non-empty audio bytes; `ttfa_admitted_try_ms_*` from the admitted try alone; beside them
  the server's own mean TTFA over the level (its /metrics histogram: arrival to first chunk).
- RTF: end-to-end latency / audio duration (PCM bytes / (2 * sample rate)).
- audio s/s: total audio seconds / wall seconds of the measured window (first send to last end).
- stalls and goodput (serving/playback.py): a real-time player starts at the first audio byte
  and plays at 1x. `stalled_share`: completed streams whose player fell more than
  `--stall-threshold-ms` (100) behind (the sum of its stalls); `stalled_one_gap_share`: those with
  one stall over it. Goodput: streams with TTFA within `--ttfa-budget-ms` (1000) that are not
  stalled: their count, share of the level's streamed requests, audio s/s, and `goodput_ratio`
  (goodput / all audio s/s). `goodput_vs_best`: against the best audio s/s of any level of the
  run (`best_audio_s_per_s`). The older underrun fields stay: requests with any stall, total and
  longest stall, and stalls in the first second of audio (the chunk ramp) or later.
- refusals (serving/refusals.py): 429/503 answers are retried after their Retry-After (or a
  doubling backoff from `--retry-backoff-ms`); per level the requests refused at least once and
  their share, the refused answers, the share with Retry-After, time to refusal p50/p95, tries
  per request, and the requests that gave up (`--max-tries`, or `--request-timeout` from the
  first try). Those are not `failed`.
- time to gapless audio: client time from sending the request to the earliest moment a player
  could start and then play the whole stream at 1x without a stall (TTFA when nothing stalls;
  what a client that buffers before playing must wait).
- from the server's /metrics (serving/server_metrics.py), over the level: Stage 0 step time and
  rows, step modes, the codec's windows per call, graph share and busy fraction, the watermark
  stage's busy fraction and ms per audio second (`--watermark on|off` starts the server so), the
  word timestamps' alignment wait and failures, and every playback series the server exports
  (stalls as it sees them, slack, queue wait, admission: `server_playback`).
- word timestamps (a `words` variant, or `--word-timestamps on` with `--stream-format sse`): the
  lag of each request's `speech.words` events behind its last audio delta, and words received.
- GPU memory: the largest nvidia-smi memory.used seen while the level ran (if nvidia-smi exists).
- CPU (serving/process_cpu.py, only when this tool started the server, or `--server-pid`): the
  server process's cores busy and CPU ms per audio second, with its encoder processes and with
  all its children; the host's load average at the level's start and end and this client's own
  cores busy (on a small host the client shares the cores it measures).
- Formats other than pcm: audio seconds are the frames asked for (every request gets exactly
  its N frames), and a player's stalls are timed at the stream's mean byte rate.

Usage:
  PYTHONPATH=src python3 benchmarks/serving/bench_serving.py --model /tmp/h4b --load-format dummy \
      --deploy-config higgs_multimodal_qwen3_low_latency --concurrency 1 4 16 --out ll.json
  --url http://host:port benchmarks a server that is already running (no subprocess).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import (command_line, device_description, git_commit, gpu_memory_used_mib,  # noqa: E402
                    markdown_table, mean, now_iso, percentile, write_json)
from serving.playback import continuity_metrics, heard, playback_stalls  # noqa: E402
from serving.process_cpu import (children_cpu_s, descendants_cpu_s, encoder_children, process_cpu_s,  # noqa: E402
                                 server_cpu_metrics)
from serving.refusals import refusal_metrics  # noqa: E402
from serving.server_metrics import (alignment_metrics, codec_metrics, engine_step_metrics,  # noqa: E402
                                    playback_series, scrape_metrics, server_ttfa_metrics, step_kind_metrics,
                                    watermark_metrics)
from serving.server_process import start_server, stop_server, wait_ready  # noqa: E402
from serving.stream_client import (BYTES_PER_SAMPLE, FRAME_SAMPLES, RequestRecord, closed_loop,  # noqa: E402
                                   http_client)
from serving.variants import RESPONSE_FORMATS, level_plan, parse_variant  # noqa: E402


# ------------------------------------------------------------------------------ one level
async def _poll_gpu_memory(peak: list[int], stop: asyncio.Event, interval_s: float) -> None:
    """Keep the largest total nvidia-smi memory.used (MiB) seen until `stop` is set."""
    while not stop.is_set():
        used = await asyncio.to_thread(gpu_memory_used_mib)
        if used is None:
            return
        peak[0] = max(peak[0], sum(used))
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except asyncio.TimeoutError:
            pass


def level_metrics(concurrency: int, records: list[RequestRecord], window_s: float,
                  ttfa_budget_s: float = 1.0, stall_threshold_s: float = 0.1) -> dict:
    """TTFA, gapless start, stalls and goodput over the streamed requests; RTF, latency and audio
    over all (whole-file requests, `--file-every`, also get their own latency); refusals over
    every request sent."""
    ok = [r for r in records if r.ok]
    streams = [r for r in ok if r.streamed]
    files = [r.latency_s for r in ok if not r.streamed]
    ttfa = [r.ttfa_s * 1e3 for r in streams]
    admitted_ttfa = [r.admitted_ttfa_s * 1e3 for r in streams]
    # the client's TTFA less the server's own, request by request: time before the server's
    # handler took the request and after its first audio left (network, HTTP, the client)
    outside = [r.admitted_ttfa_s * 1e3 - r.server_ttfa_ms for r in streams if r.server_ttfa_ms is not None]
    gapless = [r.gapless_s * 1e3 for r in streams]
    rtf = [r.latency_s / r.audio_s for r in ok]
    latency = [r.latency_s for r in ok]
    audio = sum(r.audio_s for r in ok)
    stalls = [playback_stalls(r.arrivals, r.bytes_per_s) for r in streams]
    failed = [r for r in records if not r.ok and not r.gave_up]
    metrics = {
        "concurrency": concurrency,
        "requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({f"{r.status}: {r.error}" for r in failed})[:5],
        "wrong_length": sum(1 for r in ok if r.response_format == "pcm"
                            and r.num_bytes != r.frames * FRAME_SAMPLES * BYTES_PER_SAMPLE),
        "window_s": window_s,
        "ttfa_ms_p50": percentile(ttfa, 50), "ttfa_ms_p90": percentile(ttfa, 90),
        "ttfa_ms_p99": percentile(ttfa, 99), "ttfa_ms_mean": mean(ttfa),
        "ttfa_admitted_try_ms_p50": percentile(admitted_ttfa, 50),
        "ttfa_admitted_try_ms_p95": percentile(admitted_ttfa, 95),
        "ttfa_admitted_try_ms_p99": percentile(admitted_ttfa, 99),
        "outside_server_ms_p50": percentile(outside, 50), "outside_server_ms_p99": percentile(outside, 99),
        "gapless_ms_p50": percentile(gapless, 50), "gapless_ms_p99": percentile(gapless, 99),
        "rtf_mean": mean(rtf), "rtf_p50": percentile(rtf, 50), "rtf_p99": percentile(rtf, 99),
        "latency_s_p50": percentile(latency, 50), "latency_s_p99": percentile(latency, 99),
        "audio_s_total": audio,
        "audio_s_per_s": audio / window_s if window_s > 0 else None,
        "requests_per_s": len(ok) / window_s if window_s > 0 else None,
        "underrun_requests": sum(1 for s in stalls if s),
        "stall_s_total": sum(length for s in stalls for _, length in s),
        "stall_s_max": max((length for s in stalls for _, length in s), default=0.0),
        # where streams ran dry: in the first chunks (the ramp after the first audio, where the
        # player's lead is thinnest) or later (steady state)
        "stalls_in_first_s": sum(1 for s in stalls for at, _ in s if at < 1.0),
        "stalls_later": sum(1 for s in stalls for at, _ in s if at >= 1.0),
        "chunks_per_request_mean": mean([len(r.arrivals) for r in streams]),
        "file_requests": len(files),
        "file_latency_s_p50": percentile(files, 50), "file_latency_s_p99": percentile(files, 99),
    }
    metrics.update(continuity_metrics([heard(r.ttfa_s, r.arrivals, r.bytes_per_s, r.audio_s) for r in streams],
                                      sum(1 for r in records if r.streamed), window_s,
                                      ttfa_budget_s, stall_threshold_s))
    metrics["goodput_ratio"] = (metrics["goodput_audio_s_per_s"] / metrics["audio_s_per_s"]
                                if metrics["audio_s_per_s"] else None)
    metrics.update(refusal_metrics([r.refusals for r in records], [r.status for r in records]))
    return metrics


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_level(url: str, concurrency: int, args: argparse.Namespace, first_index: int,
                    warmup: int, server_pid: int | None = None) -> tuple[dict, int]:
    """`warmup` untimed requests, then the measured ones at one concurrency; returns (metrics,
    next request index)."""
    num = args.num_requests or max(2 * concurrency, 6)
    async with http_client(args, 2) as client:  # /metrics only: the requests have their own
        index = first_index
        if warmup:
            warm = await closed_loop(url, list(range(index, index + warmup)), concurrency, args)
            index += warmup
            bad = [r for r in warm if not r.ok]
            if bad:
                raise SystemExit(f"bench_serving: warm-up request failed at c={concurrency}: "
                                 f"{bad[0].status} {bad[0].error}")
        peak = [0]
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_gpu_memory(peak, stop, 1.0))
        before = await scrape_metrics(client, url)
        children = encoder_children(server_pid)
        cpu_before, children_before = process_cpu_s(server_pid), children_cpu_s(children)
        descendants_before = descendants_cpu_s(server_pid)
        load_before, own_before = os.getloadavg()[0], _own_cpu_s()
        t0 = time.perf_counter()
        records = await closed_loop(url, list(range(index, index + num)), concurrency, args)
        window = max(r.end for r in records) - t0
        own = _own_cpu_s() - own_before
        cpu_after = process_cpu_s(server_pid)
        children_after = children_cpu_s(encoder_children(server_pid))
        descendants_after = descendants_cpu_s(server_pid)
        after = await scrape_metrics(client, url)
        stop.set()
        await poller
    metrics = level_metrics(concurrency, records, window, args.ttfa_budget_ms / 1e3, args.stall_threshold_ms / 1e3)
    metrics.update(server_cpu_metrics(cpu_before, cpu_after, window, metrics["audio_s_total"],
                                      children_before, children_after))
    metrics.update(engine_step_metrics(before, after))
    metrics.update(server_ttfa_metrics(before, after))
    metrics.update(codec_metrics(before, after, window))
    metrics.update(watermark_metrics(before, after, window))
    metrics.update(alignment_metrics(before, after, records))
    # every child process's CPU (aligner workers and encoder processes alike)
    child = (descendants_after - descendants_before
             if None not in (descendants_before, descendants_after) else None)
    metrics["server_children_cpu_ms_per_audio_s"] = (1e3 * child / metrics["audio_s_total"]
                                                     if child is not None and metrics["audio_s_total"] else None)
    metrics.update(step_kind_metrics(before, after))
    metrics["server_playback"] = playback_series(before, after)
    metrics["gpu_mem_used_mib_max"] = peak[0] or None
    metrics.update(host_load_1m_start=load_before, host_load_1m_end=os.getloadavg()[0],
                   client_cpu_cores=own / window if window > 0 else None)
    return metrics, index + num


def best_of_run(levels: list[dict]) -> dict | None:
    """The run's best audio s/s (its level), and each level's goodput against it (in place):
    what the server can give at its best, against what listeners got at each load."""
    measured = [lv for lv in levels if lv.get("audio_s_per_s")]
    if not measured:
        return None
    best = max(measured, key=lambda lv: lv["audio_s_per_s"])
    for lv in levels:
        good = lv.get("goodput_audio_s_per_s")
        lv["goodput_vs_best"] = good / best["audio_s_per_s"] if good is not None else None
    return {"audio_s_per_s": best["audio_s_per_s"], "concurrency": best["concurrency"],
            "variant": best.get("variant")}


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model directory or hub id (required unless --url)")
    p.add_argument("--url", default=None, help="benchmark an already running server instead of starting one")
    p.add_argument("--deploy-config", default=None, help="deploy YAML path or shipped profile name")
    p.add_argument("--label", default=None, help="name of this run in tables and plots (default: the deploy config)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64],
                   help="the levels of every variant that names none (levels run lowest first)")
    p.add_argument("--num-requests", type=int, default=None, help="measured requests per level (default max(2c, 6))")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed requests before the first level (graphs are captured at start-up, so "
                        "later levels need none)")
    p.add_argument("--frames", type=int, default=250, help="audio frames per request (25 = 1 s)")
    p.add_argument("--file-every", type=int, default=0,
                   help="every N-th request asks for the whole file (stream: false) instead of a stream; "
                        "streaming metrics cover the streamed ones (0: all streamed)")
    p.add_argument("--frames-spread", type=float, default=0.0,
                   help="draw each request's frames uniformly from frames*(1 +- this), seeded per request "
                        "(0: all --frames)")
    p.add_argument("--seed", type=int, default=1234, help="request i uses seed + i")
    p.add_argument("--response-format", dest="response_formats", nargs="+", default=None, choices=RESPONSE_FORMATS,
                   help="the format requests stream (default pcm); several: each concurrency level runs once "
                        "per format, in the order given, on the same server (ratios side by side)")
    p.add_argument("--variants", nargs="+", default=None, metavar="SPEC",
                   help="request variants swept on the one server, each at its own levels: "
                        "FORMAT[+sse][+words][@C,C,...] (serving/variants.py); instead of --response-format")
    p.add_argument("--stall-threshold-ms", type=float, default=100.0,
                   help="a stream whose player falls more than this behind is stalled")
    p.add_argument("--ttfa-budget-ms", type=float, default=1000.0,
                   help="goodput counts streams whose TTFA (from the first try) is within this and that "
                        "are not stalled")
    p.add_argument("--max-tries", type=int, default=0,
                   help="tries per request when refused (429/503); 0: until --request-timeout from the first try")
    p.add_argument("--retry-backoff-ms", type=float, default=100.0,
                   help="the first wait after a refusal without Retry-After (doubling, at most 2 s)")
    p.add_argument("--server-pid", type=int, default=None,
                   help="with --url: read this process's CPU from /proc per level (e.g. a front end)")
    p.add_argument("--no-stream-field", action="store_true",
                   help="send neither stream nor stream_format (an OpenAI client's request; it "
                        "streams all the same, but in wav and flac, where it is a file)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--served-model-name", default=None, help="sent as `model` (default: omitted)")
    p.add_argument("--port", type=int, default=0, help="server port (0: a free one)")
    p.add_argument("--watermark", choices=["on", "off"], default=None,
                   help="start the server with the watermark on or off (default: the profile's, on)")
    p.add_argument("--stream-format", choices=["audio", "sse"], default="audio",
                   help="streamed requests as raw bytes of the format (audio) or SSE events (sse)")
    p.add_argument("--word-timestamps", choices=["on", "off"], default="off",
                   help="on: every request asks for word timestamps (needs --stream-format sse: a raw "
                        "stream asking for them waits for the whole audio); off: the field is left out")
    p.add_argument("--server-arg", action="append", default=[], help="extra argument for `serve` (repeatable)")
    p.add_argument("--server-log", default=None, help="server stdout/stderr file (default: a temp file)")
    p.add_argument("--server-log-level", default="WARNING")
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for /ready")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--max-minutes", type=float, default=None,
                   help="start no new level after this many minutes (the rest are listed as skipped)")
    p.add_argument("--out", default=None, help="write the JSON here (rewritten after every level)")
    args = p.parse_args(argv)
    if args.url is None and args.model is None:
        p.error("--model is required (or --url for a running server)")
    if min(args.concurrency) < 1 or args.frames < 1 or args.warmup < 0:
        p.error("--concurrency and --frames must be >= 1, --warmup >= 0")
    if not 0.0 <= args.frames_spread < 1.0:
        p.error("--frames-spread must be in [0, 1)")
    if args.file_every < 0 or args.max_tries < 0 or args.retry_backoff_ms < 0:
        p.error("--file-every, --max-tries and --retry-backoff-ms must be >= 0")
    if args.stall_threshold_ms <= 0 or args.ttfa_budget_ms <= 0:
        p.error("--stall-threshold-ms and --ttfa-budget-ms must be > 0")
    if args.variants and args.response_formats:
        p.error("give --variants or --response-format, not both (a variant names its format)")
    try:
        args.variants = [parse_variant(spec, args.concurrency, args.stream_format, args.word_timestamps)
                         for spec in args.variants or args.response_formats or ["pcm"]]
    except ValueError as exc:
        p.error(f"{exc} (--variants, --stream-format, --word-timestamps)")
    if args.no_stream_field and any(v.stream_format == "sse" for v in args.variants):
        p.error("--no-stream-field sends no stream_format, so an sse variant would stream raw audio")
    args.response_formats = list(dict.fromkeys(v.response_format for v in args.variants))
    args.response_format = args.variants[0].response_format  # a level's own variant replaces it (main)
    args.concurrency = sorted({c for v in args.variants for c in v.levels})  # every level (--max-queue)
    return args


TABLE_COLUMNS = [
    ("concurrency", "c"), ("variant", "variant"), ("completed", "ok"), ("failed", "failed"),
    ("ttfa_ms_p50", "TTFA p50 ms"), ("ttfa_ms_p90", "p90"), ("ttfa_ms_p99", "p99"),
    ("server_ttfa_ms_mean", "server TTFA mean ms"), ("outside_server_ms_p50", "outside server p50 ms"),
    ("rtf_mean", "RTF mean"), ("rtf_p50", "p50"), ("rtf_p99", "p99"), ("audio_s_per_s", "audio s/s"),
    ("requests_per_s", "req/s"),
    ("stalled_share", "stalled"), ("goodput_share", "goodput streams"), ("goodput_audio_s_per_s", "goodput audio s/s"),
    ("refused_requests", "refused"), ("tries_per_request_mean", "tries/req"), ("refusal_ms_p95", "refusal p95 ms"),
    ("retry_after_share", "Retry-After"), ("gave_up", "gave up"),
    ("underrun_requests", "underrun req"), ("stall_s_total", "stall s"), ("stalls_in_first_s", "stalls in 1st s"),
    ("gapless_ms_p50", "gapless p50 ms"),
    ("engine_step_ms_mean", "step ms"), ("engine_rows_per_step", "rows/step"),
    ("codec_windows_per_call", "codec windows/call"), ("codec_busy_fraction", "codec busy"),
    ("watermark_busy_fraction", "mark busy"), ("watermark_busy_ms_per_audio_s", "mark ms/audio s"),
    ("words_lag_ms_p50", "words lag p50 ms"), ("server_alignment_ms_mean", "align ms mean"),
    ("alignment_failures", "align failures"), ("server_children_cpu_ms_per_audio_s", "child procs CPU ms/audio s"),
    ("gpu_mem_used_mib_max", "GPU MiB"),
    ("server_cpu_cores", "server cores"), ("server_cpu_ms_per_audio_s", "server CPU ms/audio s"),
    ("server_and_encoders_cpu_cores", "+ encoder procs cores"), ("host_load_1m_end", "load 1m"),
]


def print_table(result: dict) -> None:
    settings = result["settings"]
    spread = settings.get("frames_spread") or 0
    frames = f"{settings['frames']}" + (f" ± {spread:.0%}" if spread else "")
    print(f"\nServing benchmark: {result['label']} ({frames} frames/request, "
          f"{', '.join(v['name'] for v in settings['variants'])}, "
          f"server ready in {result['server']['ready_s'] or 0:.1f} s; stalled: > {settings['stall_threshold_ms']:g} ms "
          f"behind; goodput: TTFA <= {settings['ttfa_budget_ms']:g} ms and not stalled)\n")
    print(markdown_table(result["levels"], TABLE_COLUMNS))


def new_result(args: argparse.Namespace, server_cmd: list[str] | None, log_path: Path | None) -> dict:
    return {
        "tool": "bench_serving",
        "label": args.label or args.deploy_config or "default",
        "command": command_line(),
        "git_commit": git_commit(),
        "device": device_description(),
        "started_at": now_iso(),
        "finished_at": None,
        "settings": {"model": args.model, "deploy_config": args.deploy_config, "load_format": args.load_format,
                     "frames": args.frames, "frames_spread": args.frames_spread, "file_every": args.file_every,
                     "warmup": args.warmup, "num_requests": args.num_requests,
                     "concurrency": args.concurrency, "seed": args.seed, "url": args.url,
                     "watermark": args.watermark, "response_format": args.response_formats,
                     "variants": [{"name": v.name, "levels": list(v.levels)} for v in args.variants],
                     "stream_format": args.stream_format, "word_timestamps": args.word_timestamps,
                     "stall_threshold_ms": args.stall_threshold_ms, "ttfa_budget_ms": args.ttfa_budget_ms,
                     "max_tries": args.max_tries, "retry_backoff_ms": args.retry_backoff_ms,
                     "server_pid": args.server_pid, "no_stream_field": args.no_stream_field,
                     "host_cores": os.cpu_count(), "host_load_1m_at_start": os.getloadavg()[0]},
        "server": {"command": server_cmd, "ready_s": None, "log": str(log_path) if log_path else None,
                   "exit_code": None},
        "levels": [],
        "best_audio_s_per_s": None,
        "skipped_concurrency": [],
        "skipped_levels": [],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    proc, url, log_path, server_cmd = (None, args.url, None, None) if args.url else start_server(args)
    result = new_result(args, server_cmd, log_path)
    try:
        if proc is not None:
            result["server"]["ready_s"] = wait_ready(proc, url, args.ready_timeout, log_path)
            print(f"server ready at {url} after {result['server']['ready_s']:.1f} s", flush=True)
        index = 0
        server_pid = proc.pid if proc is not None else args.server_pid
        for concurrency, variant in level_plan(args.variants):
            if args.max_minutes is not None and time.perf_counter() - t_start > 60 * args.max_minutes:
                result["skipped_levels"].append({"concurrency": concurrency, "variant": variant.name})
                if concurrency not in result["skipped_concurrency"]:
                    result["skipped_concurrency"].append(concurrency)
                continue
            warmup = args.warmup if not result["levels"] else 0
            level_args = argparse.Namespace(**{**vars(args), "response_format": variant.response_format,
                                               "stream_format": variant.stream_format,
                                               "word_timestamps": variant.word_timestamps})
            metrics, index = asyncio.run(run_level(url, concurrency, level_args, index, warmup, server_pid))
            metrics.update(variant=variant.name, response_format=variant.response_format,
                           stream_format=variant.stream_format, word_timestamps=variant.word_timestamps)
            result["levels"].append(metrics)
            result["best_audio_s_per_s"] = best_of_run(result["levels"])
            print(f"c={concurrency} {variant.name}: {metrics['completed']}/{metrics['requests']} ok, "
                  f"TTFA p50 {metrics['ttfa_ms_p50'] or 0:.0f} ms, RTF mean {metrics['rtf_mean'] or 0:.3f}, "
                  f"{metrics['audio_s_per_s'] or 0:.1f} audio s/s, stalled {metrics['stalled_share'] or 0:.1%}, "
                  f"goodput {metrics['goodput_audio_s_per_s'] or 0:.1f} audio s/s, "
                  f"refused {metrics['refused_requests']}", flush=True)
            if args.out:  # after every level, so a run cut short still leaves its numbers
                write_json(args.out, result)
    finally:
        if proc is not None:
            result["server"]["exit_code"] = stop_server(proc)
    result["finished_at"] = now_iso()
    if args.out:
        write_json(args.out, result)
    if result["skipped_levels"]:
        skipped = ", ".join(f"c={s['concurrency']} {s['variant']}" for s in result["skipped_levels"])
        print(f"skipped (--max-minutes {args.max_minutes}): {skipped}")
    print_table(result)
    return 1 if any(level["failed"] for level in result["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
