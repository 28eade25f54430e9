"""The data-parallel front end's cost on eight fake replicas (issue 44), beside the replicas
reached directly, in one run.

A stand-in for an eight-GPU host: `--replicas` fake servers (benchmarks/cluster/serve_fake.py: the real
HTTP server over the test suite's fake engine, each stream `--chunk-frames` frames every
`--delay` s) on private Unix sockets, owned by one front end (cluster/frontend.py: the relay and
the control plane, on uvloop) in a process of its own. Each level runs a closed loop for
`--seconds` after `--warmup-s`, first straight to the replicas (requests spread round-robin over
their sockets) and then through the front end, at the same concurrency and with the same
requests. The front end's CPU is read from /proc/PID/stat over each measured window, so the fakes
and this client, which share the machine's cores, are not counted. Parts:

- `stream`: `--frames` (250 = 10 s) raw pcm and SSE, at each `--concurrency`: front-end CPU-ms
  per audio-second relayed, audio-s/s through it and direct (their ratio), TTFB;
- `short`: 1-audio-second pcm requests at `--short-concurrency`: front-end CPU-ms per request,
  requests a second through it and direct;
- `ttfb`: c = 1, 1-second requests: TTFB p50 through the front end less direct; and an answer
  that comes at once (a replica's 400), whose round trip shows the relay's own latency;
- `clone`: a 500 KB `ref_audio` body against zero-shot, 1-second requests at c = 16: the extra
  front-end CPU-ms per request.

Usage (the committed run):
  PYTHONPATH=src python benchmarks/cluster/bench_relay.py --out benchmarks/results/relay_8_fakes.json
A quick look:
  PYTHONPATH=src python benchmarks/cluster/bench_relay.py --replicas 2 --concurrency 16 --seconds 4 \\
      --parts stream --out /tmp/relay.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: common, the groups
from common import command_line, git_commit, now_iso, percentile, write_json  # noqa: E402

from higgs_serve.cluster.relay.responses import ResponseBody, read_head  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
BYTES_PER_AUDIO_S = 24000 * 2  # s16le mono 24 kHz
FRAMES_PER_S = 25


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--delay", type=float, default=0.4, help="the fakes' seconds between chunks")
    p.add_argument("--chunk-frames", type=int, default=25)
    p.add_argument("--frames", type=int, default=250, help="frames per streamed request (25 = 1 s)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--short-concurrency", type=int, nargs="+", default=[64, 256])
    p.add_argument("--formats", nargs="+", default=["pcm", "sse"], choices=["pcm", "sse"])
    p.add_argument("--parts", nargs="+", default=["stream", "short", "ttfb", "clone"],
                   choices=["stream", "short", "ttfb", "clone"])
    p.add_argument("--seconds", type=float, default=12.0, help="measured window per level")
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--ttfb-requests", type=int, default=60)
    p.add_argument("--clone-bytes", type=int, default=500_000, help="size of the ref_audio field")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- the front end
def run_frontend_child(port: int, work: Path, replicas: int, fake_args: list[str]) -> None:
    """The front end over `replicas` fakes (its children), on 127.0.0.1:port, until SIGTERM."""
    from higgs_serve.cluster.frontend import Frontend, FrontendSettings, serve_frontend
    from higgs_serve.cluster.launch import _loop_factory
    from higgs_serve.cluster.replicas import Replica
    from higgs_serve.cluster.routing import Router

    def command(path: Path) -> list[str]:
        return [sys.executable, str(HERE / "serve_fake.py"), "--uds", str(path), "--clone", *fake_args]

    fleet = {str(i): Replica(id=str(i), socket_path=work / f"replica-{i}.sock", command=command,
                             stop_with_parent=True) for i in range(replicas)}
    frontend = Frontend(fleet, Router({rid: 1024 for rid in fleet}), work / "voices", 24000,
                        FrontendSettings(graceful_shutdown_s=1))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(4096)

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await serve_frontend(frontend, listener, work, stop)

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())


def cpu_s(pids: int | list[int]) -> float:
    """CPU seconds (user + system) the process(es) used so far, summed."""
    total = 0
    for pid in [pids] if isinstance(pids, int) else pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / CLK_TCK


# ----------------------------------------------------------------------------- the client
class Target:
    """Where requests go: the front end (TCP) or the replicas' sockets in turn (direct)."""

    def __init__(self, port: int | None = None, sockets: list[str] | None = None):
        self.port, self.sockets, self.turn = port, sockets, 0

    async def connect(self):
        if self.port is not None:
            return await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        self.turn += 1
        return await asyncio.open_unix_connection(self.sockets[self.turn % len(self.sockets)],
                                                  limit=1 << 20)

    @property
    def sticky(self) -> bool:
        """Direct requests take a new replica (connection) each; the front end keeps one."""
        return self.port is not None


def request_bytes(body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (b"POST /v1/audio/speech HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(payload)) + payload


async def one(conn, message: bytes, count=lambda n: None) -> tuple[int, float, float, int]:
    """(status, seconds to the head, seconds to the first body byte, body bytes); count(n) is
    told of every n body bytes as they arrive."""
    reader, writer = conn
    start = time.perf_counter()
    writer.write(message)
    head = await read_head(reader)
    at_head = time.perf_counter() - start
    follower = ResponseBody(head, b"POST")
    first, size = None, 0
    while not follower.empty:
        data = await reader.read(1 << 20)
        if not data:
            raise ConnectionError("cut")
        if first is None:
            first = time.perf_counter() - start
        size += len(data)
        count(len(data))
        if follower.feed(data):
            break
    return head.status, at_head, first if first is not None else at_head, size


async def closed_loop(target: Target, message: bytes, concurrency: int, warmup_s: float,
                      seconds: float, pid: int | None) -> dict:
    """`concurrency` workers for warmup_s + seconds; counts what happens in the last `seconds`."""
    t0 = time.perf_counter()
    window = (t0 + warmup_s, t0 + warmup_s + seconds)
    tally = {"bytes": 0, "done": 0, "errors": 0, "ttfb": []}
    marks: dict[str, float] = {}

    def count(n: int) -> None:  # bytes relayed inside the window, whichever request they are of
        if window[0] <= time.perf_counter() <= window[1]:
            tally["bytes"] += n

    async def worker() -> None:
        conn = None
        while time.perf_counter() < window[1]:
            try:
                if conn is None:
                    conn = await target.connect()
                status, _, first, size = await one(conn, message, count)
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                conn = None
                if window[0] <= time.perf_counter() <= window[1]:
                    tally["errors"] += 1
                continue
            now = time.perf_counter()
            if window[0] <= now <= window[1]:
                if status == 200:
                    tally["done"] += 1
                    tally["ttfb"].append(first)
                else:
                    tally["errors"] += 1
            if not target.sticky:
                conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    async def meter() -> None:
        await asyncio.sleep(max(0.0, window[0] - time.perf_counter()))
        marks["cpu0"] = cpu_s(pid) if pid else 0.0
        marks["t0"] = time.perf_counter()
        await asyncio.sleep(max(0.0, window[1] - time.perf_counter()))
        marks["cpu1"] = cpu_s(pid) if pid else 0.0
        marks["t1"] = time.perf_counter()

    await asyncio.gather(meter(), *(worker() for _ in range(concurrency)))
    wall = marks["t1"] - marks["t0"]
    return {"concurrency": concurrency, "wall_s": wall, "requests": tally["done"],
            "errors": tally["errors"], "body_bytes": tally["bytes"],
            "requests_per_s": tally["done"] / wall,
            "ttfb_ms_p50": _ms(percentile(tally["ttfb"], 50)),
            "ttfb_ms_p99": _ms(percentile(tally["ttfb"], 99)),
            "frontend_cpu_s": (marks["cpu1"] - marks["cpu0"]) if pid else None}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1e3 * value, 3)


# ----------------------------------------------------------------------------- the parts
def speech_body(frames: int, fmt: str, **extra) -> dict:
    body = {"input": "The quick brown fox jumps over the lazy dog.", "response_format": "pcm",
            "max_new_tokens": frames, "min_new_tokens": frames, "stream": True, **extra}
    if fmt == "sse":
        body["stream_format"] = "sse"
    return body


async def bytes_per_audio_s(target: Target, fmt: str) -> float:
    """Body bytes of one second of audio in `fmt` (pcm: 48,000; SSE: base64 and envelopes)."""
    conn = await target.connect()
    try:
        _, _, _, size = await one(conn, request_bytes(speech_body(4 * FRAMES_PER_S, fmt)))
    finally:
        conn[1].close()
    return size / 4


async def compare(args, frontend: Target, direct: Target, pid: int, message: bytes,
                  concurrency: int, per_audio_s: float | None = None) -> dict:
    row = {"concurrency": concurrency}
    for label, target in (("direct", direct), ("frontend", frontend)):
        result = await closed_loop(target, message, concurrency, args.warmup_s, args.seconds,
                                   pid if target is frontend else None)
        if per_audio_s:
            result["audio_s_per_s"] = result["body_bytes"] / per_audio_s / result["wall_s"]
        row[label] = result
    fe = row["frontend"]
    cpu_ms = 1e3 * fe["frontend_cpu_s"]
    row["frontend_cpu_ms_per_request"] = cpu_ms / fe["requests"] if fe["requests"] else None
    row["frontend_cpu_share_of_one_core"] = fe["frontend_cpu_s"] / fe["wall_s"]
    if per_audio_s:
        audio = fe["body_bytes"] / per_audio_s
        row["frontend_cpu_ms_per_audio_s"] = cpu_ms / audio if audio else None
        row["throughput_ratio"] = fe["audio_s_per_s"] / row["direct"]["audio_s_per_s"]
    else:
        row["throughput_ratio"] = fe["requests_per_s"] / row["direct"]["requests_per_s"]
    print(json.dumps({k: v for k, v in row.items() if k not in ("direct", "frontend")}), flush=True)
    return row


async def part_stream(args, frontend, direct, pid) -> dict:
    out = {}
    for fmt in args.formats:
        per_audio_s = await bytes_per_audio_s(direct, fmt)
        message = request_bytes(speech_body(args.frames, fmt))
        out[fmt] = {"bytes_per_audio_s": per_audio_s, "levels": [
            await compare(args, frontend, direct, pid, message, c, per_audio_s)
            for c in args.concurrency]}
    return out


async def part_short(args, frontend, direct, pid) -> dict:
    message = request_bytes(speech_body(FRAMES_PER_S, "pcm"))
    return {"frames": FRAMES_PER_S, "levels": [
        await compare(args, frontend, direct, pid, message, c) for c in args.short_concurrency]}


async def sequential(target: Target, message: bytes, count: int) -> list[float]:
    """TTFBs of `count` requests one after another on one kept-alive connection (direct: to one
    replica; the front end keeps its own upstream connection alive the same way)."""
    conn = await target.connect()
    times = []
    try:
        for _ in range(count):
            _, _, first, _ = await one(conn, message)
            times.append(first)
    finally:
        conn[1].close()
    return times


async def part_ttfb(args, frontend, direct, pid) -> dict:
    out = {}
    cases = {"speech_1s": request_bytes(speech_body(FRAMES_PER_S, "pcm")),
             "immediate_400": request_bytes({"input": "x", "voice": "no-such-voice"})}
    for name, message in cases.items():
        row = {}
        for label, target in (("direct", direct), ("frontend", frontend)):
            times = await sequential(target, message, args.ttfb_requests)
            row[label] = {"p50_ms": _ms(percentile(times, 50)), "p99_ms": _ms(percentile(times, 99))}
        row["added_ms_p50"] = round(row["frontend"]["p50_ms"] - row["direct"]["p50_ms"], 3)
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


def clone_reference(size_bytes: int) -> str:
    """A wav whose base64 is about `size_bytes` long (noise, so nothing compresses it away)."""
    seconds = size_bytes * 3 / 4 / 2 / 24000
    noise = np.random.default_rng(0).standard_normal(int(seconds * 24000)).astype(np.float32) * 0.1
    buffer = io.BytesIO()
    sf.write(buffer, noise, 24000, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


async def part_clone(args, frontend, direct, pid) -> dict:
    reference = clone_reference(args.clone_bytes)
    out = {"ref_audio_chars": len(reference)}
    for name, extra in (("zero_shot", {}), ("clone", {"ref_audio": reference})):
        message = request_bytes(speech_body(FRAMES_PER_S, "pcm", **extra))
        out[name] = await compare(args, frontend, direct, pid, message, 16)
    out["extra_cpu_ms_per_request"] = (out["clone"]["frontend_cpu_ms_per_request"]
                                       - out["zero_shot"]["frontend_cpu_ms_per_request"])
    print("clone extra", out["extra_cpu_ms_per_request"], flush=True)
    return out


# ----------------------------------------------------------------------------- main
def start_frontend(args, work: Path) -> tuple[subprocess.Popen, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fake = ["--delay", str(args.delay), "--chunk-frames", str(args.chunk_frames),
            "--max-num-seqs", "512"]
    command = [sys.executable, str(Path(__file__).resolve()), "--out", "-", "--frontend-child",
               str(port), str(work), str(args.replicas), *fake]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(work / "fe.log", "ab"))
    deadline = time.monotonic() + 120
    import httpx

    while True:
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).json()
            if ready.get("replicas_ready") == args.replicas:
                return process, port
        except (httpx.HTTPError, ValueError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bench_relay: the front end did not start; log {work / 'fe.log'}")
        time.sleep(0.5)


async def idle(args, pid: int) -> dict:
    """The front end with no traffic: the supervisor's polls (2 per replica every 0.5 s)."""
    await asyncio.sleep(args.warmup_s)
    cpu0, t0 = cpu_s(pid), time.perf_counter()
    await asyncio.sleep(args.seconds)
    return {"cpu_share_of_one_core": (cpu_s(pid) - cpu0) / (time.perf_counter() - t0)}


def net_of_idle(result: dict) -> None:
    """Per-unit CPU less what the idle front end spends over the same window."""
    share = result["idle"]["cpu_share_of_one_core"]
    rows = [row for fmt in result.get("stream", {}).values() for row in fmt["levels"]]
    rows += result.get("short", {}).get("levels", [])
    rows += [result["clone"][k] for k in ("zero_shot", "clone")] if "clone" in result else []
    for row in rows:
        fe = row["frontend"]
        busy_ms = 1e3 * (fe["frontend_cpu_s"] - share * fe["wall_s"])
        if row.get("frontend_cpu_ms_per_audio_s") is not None:
            audio = row["frontend_cpu_ms_per_audio_s"] and 1e3 * fe["frontend_cpu_s"] / row["frontend_cpu_ms_per_audio_s"]
            row["frontend_cpu_ms_per_audio_s_net_of_idle"] = busy_ms / audio if audio else None
        if fe["requests"]:
            row["frontend_cpu_ms_per_request_net_of_idle"] = busy_ms / fe["requests"]


async def run(args, frontend: Target, direct: Target, pid: int) -> dict:
    parts = {"stream": part_stream, "short": part_short, "ttfb": part_ttfb, "clone": part_clone}
    result = {"idle": await idle(args, pid)}
    print("idle", json.dumps(result["idle"]), flush=True)
    for name in args.parts:
        result[name] = await parts[name](args, frontend, direct, pid)
    net_of_idle(result)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--frontend-child" in argv:
        at = argv.index("--frontend-child")
        port, work, replicas = argv[at + 1: at + 4]
        run_frontend_child(int(port), Path(work), int(replicas), argv[at + 4:])
        return 0
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_relay_"))
    result = {"tool": "bench_relay", "command": command_line(), "git_commit": git_commit(),
              "started_at": now_iso(), "cpu_count": os.cpu_count(),
              "loadavg_start": os.getloadavg(),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "frontend_child")}}
    process, port = start_frontend(args, work)
    try:
        sockets = [str(work / f"replica-{i}.sock") for i in range(args.replicas)]
        result.update(asyncio.run(run(args, Target(port=port), Target(sockets=sockets),
                                      process.pid)))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    result["loadavg_end"] = os.getloadavg()
    result["finished_at"] = now_iso()
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
