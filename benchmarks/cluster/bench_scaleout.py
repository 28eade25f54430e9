"""Scale-out benchmark (issue 34): one replica against N replicas, and voice-affinity routing.

Two parts, each writing its own JSON section:

1. `scaling`: benchmarks/serving/bench_serving.py run twice in the same invocation, the single server
   and then `serve --devices ...` (N replicas behind the front end), at the same concurrencies,
   so the N / 1 ratio of audio s/s and the TTFA at equal per-GPU load are read side by side.
2. `affinity`: the front end with N replicas started once per routing policy (`--routing
   affinity`, then `least-loaded`). 20 voices are registered; `--clone-share` of the requests
   (0.8) clone one of them (uniformly drawn, seeded), the rest are zero-shot; closed loop at
   `--affinity-concurrency`. Reported per policy: TTFA p50/p99 of the clone requests and of all,
   the prefix-cache hit rate over the run (hits / queries in prompt tokens, summed over the
   replicas' /metrics), how many reference encodes the replicas ran, and the router's affinity
   ratio.

Usage (4B geometry with dummy weights on 4 GPUs):
  PYTHONPATH=src python3 benchmarks/cluster/bench_scaleout.py --model /tmp/h4b --load-format dummy \
      --devices 0,1,2,3 --concurrency 64 128 256 512 --out benchmarks/results/scaleout.json
CPU smoke run (tiny model, two CPU replicas):
  PYTHONPATH=src python3 benchmarks/cluster/bench_scaleout.py --model /tmp/tiny --device cpu \
      --data-parallel-size 2 --concurrency 2 --frames 8 --affinity-requests 20 --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from serving.server_process import free_port, stop_server, wait_ready  # noqa: E402
from common import (REPO_ROOT, command_line, device_description, git_commit, now_iso, nvidia_smi,  # noqa: E402
                    percentile, write_json)

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--devices", help="GPU indices of the N replicas, e.g. 0,1,2,3")
    where.add_argument("--data-parallel-size", type=int, help="N replicas (CPU with --device cpu)")
    p.add_argument("--device", default=None, help="cpu for a CPU smoke run")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--deploy-config", default=None)
    p.add_argument("--mps", action="store_true",
                   help="the N replicas' shared GPUs under NVIDIA MPS (serve --mps; --devices with a repeated GPU)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--frames", type=int, default=250, help="frames per request (25 = 1 s)")
    p.add_argument("--num-requests", type=int, default=None, help="per level (bench_serving's default)")
    p.add_argument("--parts", nargs="+", choices=["scaling", "affinity"], default=["scaling", "affinity"])
    p.add_argument("--voices", type=int, default=20)
    p.add_argument("--clone-share", type=float, default=0.8)
    p.add_argument("--affinity-concurrency", type=int, default=64)
    p.add_argument("--affinity-requests", type=int, default=512)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ready-timeout", type=float, default=1800.0)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def _n_replicas(args: argparse.Namespace) -> int:
    return len(args.devices.split(",")) if args.devices else args.data_parallel_size


def _dp_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--devices", args.devices] if args.devices else ["--data-parallel-size", str(args.data_parallel_size)]
    return flags + (["--mps"] if args.mps else [])


def _compute_apps() -> dict:
    """The processes on the GPUs (nvidia-smi), and whether an MPS server is among them: the
    replicas of an `--mps` run are its clients, so nvidia-smi lists the server."""
    apps = nvidia_smi("pid,process_name,used_memory", what="compute-apps")
    return {"compute_apps": apps, "mps_server_running": None if apps is None else
            any("nvidia-cuda-mps-server" in line for line in apps)}


def _common_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--load-format", args.load_format]
    if args.device:
        flags += ["--device", args.device]
    if args.deploy_config:
        flags += ["--deploy-config", args.deploy_config]
    return flags


# ----------------------------------------------------------------------------- part 1
def run_scaling(args: argparse.Namespace, work: Path) -> dict:
    """bench_serving.py against 1 replica (its own server), then against the front end over N
    replicas (started here, measured once every replica is ready); same levels, same requests."""
    runs, apps = {}, {}
    for label in ("1 replica", f"{_n_replicas(args)} replicas" + (" (MPS)" if args.mps else "")):
        out = work / f"scaling_{len(runs)}.json"
        command = [sys.executable, str(HERE.parent / "serving" / "bench_serving.py"), "--label", label,
                   "--frames", str(args.frames), "--out", str(out),
                   "--concurrency", *map(str, args.concurrency), "--seed", str(args.seed)]
        if args.num_requests:
            command += ["--num-requests", str(args.num_requests)]
        frontend = None
        if runs:  # the N-replica run
            frontend, url = _start_frontend(args, work, "affinity", max(args.concurrency) + 8)
            apps = _compute_apps()
            command += ["--url", url]
        else:
            command += ["--model", args.model, "--ready-timeout", str(args.ready_timeout),
                        *_common_flags(args)]
        print("+", " ".join(command), flush=True)
        try:
            subprocess.run(command, check=False)
        finally:
            if frontend is not None:
                stop_server(frontend)
        runs[label] = json.loads(out.read_text()) if out.exists() else None
    return {"runs": runs, "ratio": _ratios(runs), "n_replicas_gpu_processes": apps}


def _ratios(runs: dict) -> list[dict]:
    """Audio s/s of N replicas over 1 replica at each concurrency both runs measured."""
    (one_label, one), (many_label, many) = runs.items()
    if not one or not many:
        return []
    by_c = {level["concurrency"]: level for level in one["levels"]}
    rows = []
    for level in many["levels"]:
        base = by_c.get(level["concurrency"])
        if base and base.get("audio_s_per_s") and level.get("audio_s_per_s"):
            rows.append({"concurrency": level["concurrency"],
                         "audio_s_per_s_1": base["audio_s_per_s"],
                         "audio_s_per_s_n": level["audio_s_per_s"],
                         "ratio": level["audio_s_per_s"] / base["audio_s_per_s"],
                         "ttfa_ms_p50_1": base.get("ttfa_ms_p50"),
                         "ttfa_ms_p50_n": level.get("ttfa_ms_p50")})
    return rows


# ----------------------------------------------------------------------------- part 2
def _voice_clip(index: int) -> bytes:
    """A distinct 3 s reference per voice: a seeded mix of tones."""
    rng = np.random.default_rng(index)
    t = np.arange(3 * 24000) / 24000
    audio = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 3000, size=4)) * 0.1
    buffer = io.BytesIO()
    sf.write(buffer, audio.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def _scrape(url: str) -> dict[str, float]:
    """Counters summed over the replicas (labelled samples of the front end's /metrics)."""
    sums: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or not line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums


async def _one(client: httpx.AsyncClient, url: str, body: dict) -> tuple[float | None, bool]:
    start = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return None, False
        ttfa = None
        async for chunk in response.aiter_raw():
            if chunk and ttfa is None:
                ttfa = time.perf_counter() - start
        return ttfa, True


async def _closed_loop(url: str, bodies: list[dict], concurrency: int) -> list[tuple[float | None, bool]]:
    results: list = [None] * len(bodies)
    queue = list(enumerate(bodies))
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def worker():
            while queue:
                index, body = queue.pop(0)
                results[index] = await _one(client, url, body)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def run_affinity(args: argparse.Namespace, work: Path) -> dict:
    rng = random.Random(args.seed)
    names = [f"bench-voice-{i:02d}" for i in range(args.voices)]
    bodies = []
    for i in range(args.affinity_requests):
        body = {"input": "The quick brown fox jumps over the lazy dog.", "stream": True,
                "response_format": "pcm", "max_new_tokens": args.frames,
                "min_new_tokens": args.frames, "seed": args.seed + i}
        if rng.random() < args.clone_share:
            body["voice"] = rng.choice(names)
        bodies.append(body)
    results = {}
    for policy in ("affinity", "least-loaded"):
        results[policy] = _affinity_run(args, work, policy, names, bodies)
        print(f"{policy}: {json.dumps(results[policy])}", flush=True)
    return {"voices": args.voices, "clone_share": args.clone_share,
            "concurrency": args.affinity_concurrency, "requests": args.affinity_requests,
            "policies": results}


def _start_frontend(args, work: Path, policy: str, max_queue: int) -> tuple[subprocess.Popen, str]:
    """`serve --devices/--data-parallel-size` on a free port; returns once every replica is ready."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / f"frontend_{policy}_{port}.log"
    command = [sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve", args.model,
               "--host", "127.0.0.1", "--port", str(port), *_dp_flags(args), *_common_flags(args),
               "--routing", policy, "--voices-dir", str(work / f"voices_{policy}_{port}"),
               "--max-queue", str(max_queue)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(REPO_ROOT / "src")) if p)}
    print("+", " ".join(command), flush=True)
    with open(log, "ab") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(process, url, args.ready_timeout, log)
        deadline = time.monotonic() + args.ready_timeout
        while httpx.get(f"{url}/ready").json()["replicas_ready"] < _n_replicas(args):
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"bench_scaleout: not every replica became ready; log {log}")
            time.sleep(1)
    except BaseException:
        stop_server(process)
        raise
    return process, url


def _affinity_run(args, work: Path, policy: str, names: list[str], bodies: list[dict]) -> dict:
    process, url = _start_frontend(args, work, policy, args.affinity_concurrency + 8)
    try:
        for index, name in enumerate(names):
            httpx.post(f"{url}/v1/audio/voices", data={"name": name}, timeout=120,
                       files={"audio_sample": ("v.wav", _voice_clip(index), "audio/wav")}
                       ).raise_for_status()
        before = _scrape(url)
        start = time.perf_counter()
        outcomes = asyncio.run(_closed_loop(url, bodies, args.affinity_concurrency))
        wall = time.perf_counter() - start
        after = _scrape(url)
    finally:
        stop_server(process)
    return _affinity_metrics(bodies, outcomes, before, after, wall)


def _affinity_metrics(bodies, outcomes, before, after, wall) -> dict:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    clone = [ttfa for body, (ttfa, ok) in zip(bodies, outcomes) if ok and "voice" in body and ttfa]
    every = [ttfa for ttfa, ok in outcomes if ok and ttfa]
    queries, hits = delta("higgs_serve_prefix_cache_queries_total"), delta("higgs_serve_prefix_cache_hits_total")
    encodes = delta("higgs_serve_reference_encodes_total")
    ms = lambda v: None if v is None else 1e3 * v  # noqa: E731
    return {"completed": sum(ok for _, ok in outcomes), "failed": sum(not ok for _, ok in outcomes),
            "wall_s": wall,
            "clone_ttfa_ms_p50": ms(percentile(clone, 50)), "clone_ttfa_ms_p99": ms(percentile(clone, 99)),
            "ttfa_ms_p50": ms(percentile(every, 50)), "ttfa_ms_p99": ms(percentile(every, 99)),
            "prefix_cache_hit_rate": hits / queries if queries else None,
            # registered voices are encoded once per replica that serves them: affinity keeps
            # this near the number of voices, least-loaded drives it towards voices x replicas
            "reference_encodes": encodes,
            "router_affinity_ratio": after.get("higgs_serve_router_affinity_ratio")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_scaleout_"))
    result = {"tool": "bench_scaleout", "command": command_line(), "git_commit": git_commit(),
              "device": device_description(), "started_at": now_iso(), "replicas": _n_replicas(args),
              "settings": {k: v for k, v in vars(args).items() if k != "out"}}
    if "scaling" in args.parts:
        result["scaling"] = run_scaling(args, work)
        write_json(args.out, result)
        for row in result["scaling"]["ratio"]:
            print(f"c={row['concurrency']}: {row['audio_s_per_s_1']:.1f} -> {row['audio_s_per_s_n']:.1f} "
                  f"audio s/s (x{row['ratio']:.2f})", flush=True)
    if "affinity" in args.parts:
        result["affinity"] = run_affinity(args, work)
    result["finished_at"] = now_iso()
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
