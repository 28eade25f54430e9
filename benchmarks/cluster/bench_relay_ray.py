"""Ray Serve's proxy on bench_relay.py's workload (issue 44): the same eight fake replicas, reached
directly and through a Ray Serve application built like cluster/ray_app.py, in one run.

The application: Serve's HTTP proxy -> `HiggsIngress` (the real ingress of cluster/ray_app.py,
routing key and all) -> a deployment handle streaming from an engine deployment with the
`VoiceAffinityRouter` of cluster/ray_router.py -> each engine replica relays to one fake replica
over its Unix socket, exactly as `HiggsEngine` relays to the engine server it starts (`speech`
below is its method, minus the voice sync). So what is measured is the relay path a Ray
deployment of higgs-serve pays: proxy + ingress + engine actors, their CPU summed from
/proc (Serve's controller, its control plane, reported apart). The fakes belong to a front end
process started as bench_relay.py starts it (idle here: its polls only).

Usage (the committed run):
  PYTHONPATH=src python benchmarks/cluster/bench_relay_ray.py --out benchmarks/results/relay_ray_8_fakes.json
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: common, the groups
from cluster.bench_relay import (FRAMES_PER_S, Target, bytes_per_audio_s, compare, idle, parse_args,  # noqa: E402
                         request_bytes, speech_body, start_frontend)
from common import command_line, git_commit, now_iso, write_json  # noqa: E402


def ray_app(sockets: list[str]):
    import httpx
    from ray import serve

    from higgs_serve.cluster.ray_app import HiggsIngress, VoiceStore, response_headers

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)
    class FakeEngine:
        """HiggsEngine's relay over one of the fakes (by replica rank)."""

        def __init__(self, sockets: list[str]):
            context = serve.get_replica_context()
            rank = getattr(context.rank, "rank", context.rank)
            path = sockets[int(rank) % len(sockets)]
            self.client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path),
                                            base_url="http://replica",
                                            timeout=httpx.Timeout(None, connect=5.0))
            self.replica_id = context.replica_id.unique_id

        async def speech(self, body: bytes, headers: dict[str, str], uses_voice: bool,
                         path: str = "/v1/audio/speech"):
            request = self.client.build_request("POST", path, content=body, headers=headers)
            response = await self.client.send(request, stream=True)
            try:
                headers = {**response_headers(response.headers), "X-Higgs-Replica": self.replica_id}
                yield {"status": response.status_code, "headers": headers}
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()

        async def models(self) -> bytes:
            return (await self.client.get("/v1/models")).content

    router_config = {"request_router_class": "higgs_serve.cluster.ray_router:VoiceAffinityRouter",
                     "request_router_kwargs": {"policy": "affinity", "load_bound": 1.5},
                     "request_routing_stats_period_s": 1.0}
    engine = FakeEngine.options(num_replicas=len(sockets),
                                request_router_config=router_config).bind(sockets)
    return HiggsIngress.options(max_ongoing_requests=4096).bind(engine, VoiceStore.bind(None), None)


def serve_pids() -> dict[str, list[int]]:
    """The Serve actors' processes, by the titles Ray gives them (`ray::ProxyActor`,
    `ray::ServeReplica:bench:HiggsIngress`, ...): read from /proc, no dashboard needed."""
    pids: dict[str, list[int]] = {"relay": [], "controller": []}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::ServeController"):
            pids["controller"].append(int(entry.name))
        elif title.startswith(("ray::ProxyActor", "ray::ServeReplica:bench:HiggsIngress",
                               "ray::ServeReplica:bench:FakeEngine")):
            pids["relay"].append(int(entry.name))
    return pids


async def measure(args, ray_target: Target, direct: Target, pids: dict) -> dict:
    result = {"idle": await idle(args, pids["relay"]),
              "controller_idle": await idle(args, pids["controller"])}
    print("idle", json.dumps(result), flush=True)
    if "stream" in args.parts:
        result["stream"] = {}
        for fmt in args.formats:
            per_audio_s = await bytes_per_audio_s(direct, fmt)
            message = request_bytes(speech_body(args.frames, fmt))
            result["stream"][fmt] = {"bytes_per_audio_s": per_audio_s, "levels": [
                await compare(args, ray_target, direct, pids["relay"], message, c, per_audio_s)
                for c in args.concurrency]}
    if "short" in args.parts:
        message = request_bytes(speech_body(FRAMES_PER_S, "pcm"))
        result["short"] = {"frames": FRAMES_PER_S, "levels": [
            await compare(args, ray_target, direct, pids["relay"], message, c)
            for c in args.short_concurrency]}
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import httpx
    import ray
    from ray import serve

    work = Path(tempfile.mkdtemp(prefix="bench_relay_ray_"))
    result = {"tool": "bench_relay_ray", "command": command_line(), "git_commit": git_commit(),
              "started_at": now_iso(), "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(),
              "settings": {k: v for k, v in vars(args).items() if k != "out"}}
    process, _ = start_frontend(args, work)
    sockets = [str(work / f"replica-{i}.sock") for i in range(args.replicas)]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ray_app(sockets), name="bench", route_prefix="/", blocking=False)
        deadline = time.monotonic() + 180
        while True:
            try:
                body = speech_body(FRAMES_PER_S, "pcm")
                if httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", json=body,
                              timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the Serve app did not come up"
            time.sleep(1)
        pids = serve_pids()
        result["serve_processes"] = {k: len(v) for k, v in pids.items()}
        result.update(asyncio.run(measure(args, Target(port=port), Target(sockets=sockets), pids)))
    finally:
        serve.shutdown()
        ray.shutdown()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    result["loadavg_end"] = os.getloadavg()
    result["finished_at"] = now_iso()
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
