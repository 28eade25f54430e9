"""Engine replicas of the one-host front end: processes started, watched, restarted.

Each replica is the unchanged single-GPU server (`higgs-serve serve`) on 127.0.0.1 with its own
port and `CUDA_VISIBLE_DEVICES`. All are started at once (they warm up in parallel). The
supervisor polls each replica's /ready and /metrics, feeds the router, restarts a replica whose
process died (it is routed around meanwhile), and brings a replica that turns ready up to date
with the registered voices before it takes traffic.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from higgs_serve.cluster.routing import Router

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)  # after 1st, 2nd, ... consecutive crash
_PR_SET_PDEATHSIG = 1


def sigterm_with_parent() -> None:
    """In the child before exec: SIGTERM it if the front end dies without stopping it (Linux;
    elsewhere a killed front end leaves its replicas, and MPS daemons, running)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Replica:
    """One engine server. `command` set = a process this front end owns; None = a server
    started elsewhere (its url is fixed)."""

    id: str
    url: str = ""
    command: Callable[[int], list[str]] | None = None  # port -> argv
    env: dict[str, str | None] = field(default_factory=dict)  # over the front end's; None removes a variable
    log_path: Path | None = None
    # SIGTERM the server if the thread that started it dies (only where that thread lives as
    # long as the process: the front end's event loop, not a Ray actor's worker threads)
    stop_with_parent: bool = False
    process: subprocess.Popen | None = None
    ready: bool = False
    voices_synced: bool = False
    restarts: int = 0
    crashes_in_a_row: int = 0
    restart_at: float = 0.0

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in {**os.environ, **self.env}.items() if v is not None}
        log = open(self.log_path, "ab") if self.log_path else None  # None: the front end's
        try:
            self.process = subprocess.Popen(self.command(port), env=env, stdout=log,
                                            stderr=subprocess.STDOUT if log else None,
                                            start_new_session=True,
                                            preexec_fn=sigterm_with_parent if self.stop_with_parent else None)
        finally:
            if log is not None:
                log.close()
        logger.info("replica %s: started pid %d on %s (%s)", self.id, self.process.pid, self.url,
                    " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in self.env.items())
                    or "inherited env")

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (the server finishes its in-flight requests), SIGKILL past `timeout_s`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def replica_command(model: str, port_args: Callable[[int], list[str]]) -> Callable[[int], list[str]]:
    """argv of `higgs-serve serve MODEL` with this interpreter (the same venv and code)."""
    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "higgs_serve.cli", "serve", model, *port_args(port)]
    return command


def parse_load(metrics_text: str) -> tuple[int, float]:
    """(requests in flight, KV usage 0..1) from a replica's /metrics text."""
    values: dict[str, float] = {}
    wanted = ("higgs_serve_server_in_flight_requests", "higgs_serve_kv_blocks_free",
              "higgs_serve_kv_blocks_total")
    for line in metrics_text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            values[name] = float(value)
    total = values.get("higgs_serve_kv_blocks_total", 0.0)
    free = values.get("higgs_serve_kv_blocks_free", total)
    usage = 1.0 - free / total if total else 0.0
    return int(values.get("higgs_serve_server_in_flight_requests", 0)), usage


class Supervisor:
    """Keeps the replicas running and the router's view of them current."""

    def __init__(self, replicas: dict[str, Replica], router: Router, client: httpx.AsyncClient,
                 sync_voices: Callable[[Replica], Awaitable[None]],
                 poll_interval_s: float = POLL_INTERVAL_S):
        self.replicas = replicas
        self.router = router
        self.client = client
        self.sync_voices = sync_voices
        self.poll_interval_s = poll_interval_s

    def start_all(self) -> None:
        for replica in self.replicas.values():
            if replica.command is not None:
                replica.start()

    async def run(self) -> None:
        while True:
            await asyncio.gather(*(self._check(r) for r in self.replicas.values()))
            await asyncio.sleep(self.poll_interval_s)

    def mark_down(self, replica: Replica) -> None:
        """Route around a replica now (a refused connection), until a poll finds it ready."""
        replica.ready = False
        self.router.set_healthy(replica.id, False)

    async def _check(self, replica: Replica) -> None:
        if replica.exited:
            self._restart_later(replica)
            return
        if replica.process is None and replica.command is not None:
            if asyncio.get_running_loop().time() >= replica.restart_at:
                replica.start()
                replica.restarts += 1
            return
        try:
            ready = (await self.client.get(f"{replica.url}/ready", timeout=2.0)).status_code == 200
            if ready:
                metrics = await self.client.get(f"{replica.url}/metrics", timeout=2.0)
                in_flight, kv_usage = parse_load(metrics.text)
                self.router.report(replica.id, in_flight=in_flight, kv_usage=kv_usage)
        except httpx.HTTPError:
            ready = False
        if ready and not replica.voices_synced:
            try:
                await self.sync_voices(replica)  # before it takes traffic: voices on every replica
                replica.voices_synced = True
            except httpx.HTTPError:
                logger.warning("replica %s: voice sync failed; retrying", replica.id, exc_info=True)
                ready = False
        if ready and not replica.ready:
            logger.info("replica %s ready at %s", replica.id, replica.url)
            replica.crashes_in_a_row = 0
        replica.ready = ready
        self.router.set_healthy(replica.id, ready)

    def _restart_later(self, replica: Replica) -> None:
        code = replica.process.returncode
        logger.warning("replica %s exited with %s; restarting it", replica.id, code)
        self.mark_down(replica)
        replica.process = None
        replica.voices_synced = False
        delay = RESTART_BACKOFF_S[min(replica.crashes_in_a_row, len(RESTART_BACKOFF_S) - 1)]
        replica.crashes_in_a_row += 1
        replica.restart_at = asyncio.get_running_loop().time() + delay

    def stop_all(self) -> None:
        """SIGTERM every replica at once, then wait for each (they drain in parallel)."""
        running = [r for r in self.replicas.values() if r.process is not None and not r.exited]
        for replica in running:
            replica.process.terminate()
        for replica in running:
            replica.stop()
