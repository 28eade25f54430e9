"""Time to first audio with word timestamps on against off, side by side in one run (issue 42:
TTFA with timestamps within 1.1x of the same request without them).

One real server (`higgs-serve serve`, a subprocess; on CPU by default with a tiny random
checkpoint the benchmark writes), SSE streams (`stream_format: "sse"`: a raw stream asking for
timestamps waits for the whole audio, docs/api.md#word-timestamps), the same requests twice: the
same text and seed with `word_timestamps: true` and without it. Two levels:
- c = 1: the pair's two requests one after the other (which goes first alternates), so both see
  the same machine; a request ends after its last event (with timestamps: after its words);
- c = 2: two clients at once, one always asking for timestamps and one never, so one request's
  alignment runs while the other's audio is made (on a 2-core machine they share the cores).
Per condition: client TTFA (request sent to the first audio delta) p50 / mean / p90, the words'
lag behind the last audio delta, and the server's and its aligner processes' CPU per audio
second (/proc). bench_serving.py's client and server helpers do the work.

  PYTHONPATH=src python benchmarks/last_mile/bench_timestamps_ttfa.py --out benchmarks/results/timestamps_ttfa_cpu.json

On a GPU (the real model; dummy weights give noise, which the aligner times all the same):

  python benchmarks/last_mile/bench_timestamps_ttfa.py --model /tmp/h4b --load-format dummy --device cuda \
      --frames 250 --out benchmarks/results/timestamps_ttfa_h200.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
import serving.bench_serving as bs  # noqa: E402
import serving.server_process as sp  # noqa: E402
import serving.stream_client as sc  # noqa: E402
from serving.process_cpu import descendants_cpu_s, process_cpu_s  # noqa: E402
from common import REPO_ROOT, now_iso, percentile, provenance, write_json  # noqa: E402

CONDITIONS = ("on", "off")


def summary(records: list[sc.RequestRecord]) -> dict:
    ok = [r for r in records if r.ok]
    ttfa = [1e3 * r.ttfa_s for r in ok]
    lag = [1e3 * (r.words_at - r.arrivals[-1][0]) for r in ok if r.words_at is not None]
    return {"requests": len(records), "completed": len(ok),
            "ttfa_ms_p50": statistics.median(ttfa) if ttfa else None,
            "ttfa_ms_mean": statistics.fmean(ttfa) if ttfa else None,
            "ttfa_ms_p90": percentile(ttfa, 90), "ttfa_ms_min": min(ttfa, default=None),
            "latency_s_p50": percentile([r.latency_s for r in ok], 50),
            "words_lag_ms_p50": percentile(lag, 50), "words_lag_ms_max": max(lag, default=None),
            "words_per_request_mean": statistics.fmean(r.words for r in ok) if lag else None,
            "audio_s": sum(r.audio_s for r in ok)}


def variant(args: argparse.Namespace, condition: str) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "word_timestamps": condition})


async def level_c1(url: str, args: argparse.Namespace) -> dict[str, list[sc.RequestRecord]]:
    """Pairs one after the other; the first of each pair alternates."""
    records: dict[str, list[sc.RequestRecord]] = {c: [] for c in CONDITIONS}
    async with sc.http_client(args, 1) as client:
        for i in range(args.warmup + args.requests):
            order = CONDITIONS if i % 2 == 0 else CONDITIONS[::-1]
            for condition in order:
                record = await sc.send_one(client, url, i, variant(args, condition))
                if not record.ok:
                    raise SystemExit(f"bench_timestamps_ttfa: request {i} ({condition}) failed: "
                                     f"{record.status} {record.error}")
                if i >= args.warmup:
                    records[condition].append(record)
    return records


async def level_c2(url: str, args: argparse.Namespace) -> dict[str, list[sc.RequestRecord]]:
    """Two closed-loop clients at once, one per condition, the same requests each."""
    indices = list(range(args.requests, 2 * args.requests))  # other texts than c = 1's

    async def client_for(condition: str) -> list[sc.RequestRecord]:
        async with sc.http_client(args, 1) as client:
            return [await sc.send_one(client, url, i, variant(args, condition)) for i in indices]

    on, off = await asyncio.gather(client_for("on"), client_for("off"))
    return {"on": on, "off": off}


def measure(url: str, args: argparse.Namespace, pid: int, level) -> dict:
    cpu0, child0, t0 = process_cpu_s(pid), descendants_cpu_s(pid), time.perf_counter()
    records = asyncio.run(level(url, args))
    wall = time.perf_counter() - t0
    cpu, child = process_cpu_s(pid) - cpu0, descendants_cpu_s(pid) - child0
    result = {c: summary(records[c]) for c in CONDITIONS}
    audio_s = sum(result[c]["audio_s"] for c in CONDITIONS)
    on, off = result["on"], result["off"]
    # the same request (text, seed) with and without: pairs sent back to back see the same
    # machine, so their ratio cancels the load drift of a shared host
    paired = [a.ttfa_s / b.ttfa_s for a, b in zip(records["on"], records["off"]) if a.ok and b.ok]
    result.update({
        "wall_s": wall,
        "ttfa_paired_ratio_p50": statistics.median(paired),
        "server_cpu_ms_per_audio_s": 1e3 * cpu / audio_s,
        "aligner_cpu_ms_per_audio_s_of_timed_audio": 1e3 * child / on["audio_s"],
        "ttfa_p50_ratio_on_off": on["ttfa_ms_p50"] / off["ttfa_ms_p50"],
        "ttfa_mean_ratio_on_off": on["ttfa_ms_mean"] / off["ttfa_ms_mean"],
        "ttfa_paired_ratio_p90": percentile(paired, 90),
        "failed": sum(result[c]["requests"] - result[c]["completed"] for c in CONDITIONS),
    })
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model dir (default: a tiny random checkpoint made in a temp dir)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=60, help="measured requests per condition and level")
    p.add_argument("--warmup", type=int, default=3, help="untimed pairs first (c = 1)")
    p.add_argument("--frames", type=int, default=75, help="frames per request (25 = 1 s)")
    p.add_argument("--ratio-limit", type=float, default=1.1, help="the acceptance bound on the c = 1 p50 ratio")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    started, load_start = now_iso(), os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = str(Path(scratch) / "tiny")
            subprocess.run([sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING",
                            "make-tiny-model", model], check=True, env=_env())
        client_args = bs.parse_args(["--model", model, "--load-format", args.load_format, "--device", args.device,
                                     "--concurrency", "2", "--frames", str(args.frames),
                                     "--stream-format", "sse", "--server-arg=--alignment-workers=1"])
        port = sp.free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = Path(scratch) / "server.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(sp.server_command(client_args, port), stdout=log,
                                    stderr=subprocess.STDOUT, env=_env())
        try:
            ready_s = sp.wait_ready(proc, url, 300, log_path)
            client_args.warmup, client_args.requests = args.warmup, 0  # untimed: the aligner loads here
            asyncio.run(level_c1(url, client_args))
            client_args.warmup, client_args.requests = 0, args.requests
            levels = {"c1": measure(url, client_args, proc.pid, level_c1),
                      "c2": measure(url, client_args, proc.pid, level_c2)}
        finally:
            sp.stop_server(proc)
    result = {**provenance("bench_timestamps_ttfa", started), "loadavg_start": load_start,
              "loadavg_end": os.getloadavg(),
              "model": args.model or "tiny (random, made by the benchmark)", "device_arg": args.device,
              "frames": args.frames, "requests_per_condition": args.requests, "server_ready_s": ready_s,
              "server_command": sp.server_command(client_args, port), "levels": levels,
              "acceptance": {"ttfa_p50_ratio_c1": levels["c1"]["ttfa_p50_ratio_on_off"],
                             "limit": args.ratio_limit,
                             "met": levels["c1"]["ttfa_p50_ratio_on_off"] <= args.ratio_limit}}
    if args.out:
        write_json(args.out, result)
    for name, level in levels.items():
        print(f"{name}: TTFA p50 on {level['on']['ttfa_ms_p50']:.1f} ms, off {level['off']['ttfa_ms_p50']:.1f} ms "
              f"(x{level['ttfa_p50_ratio_on_off']:.3f}); mean x{level['ttfa_mean_ratio_on_off']:.3f}; "
              f"paired p50 x{level['ttfa_paired_ratio_p50']:.3f}; "
              f"words lag p50 {level['on']['words_lag_ms_p50']:.1f} ms; aligner CPU "
              f"{level['aligner_cpu_ms_per_audio_s_of_timed_audio']:.1f} ms per timed audio s")
    print(f"acceptance (c = 1 p50 ratio <= {args.ratio_limit}): {result['acceptance']['met']}")
    return 0 if result["acceptance"]["met"] else 1


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO_ROOT / "src")) if p)
    return env


if __name__ == "__main__":
    sys.exit(main())
