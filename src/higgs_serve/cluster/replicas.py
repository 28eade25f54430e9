"""Engine replicas of the one-host front end: processes started, watched, restarted.

Each replica is the unchanged single-GPU server (`higgs-serve serve`) listening on a Unix socket
in the front end's private work directory (mode 0700), with its own `CUDA_VISIBLE_DEVICES`: only
the front end (and its user) can reach it, so nothing goes past the front end's API key, limits
and canonical voice registry. All are started at once (they warm up in parallel). The supervisor
(control plane) polls each replica's /ready and /metrics, feeds the router, restarts a replica
whose process died (it is routed around meanwhile), and brings a replica that turns ready up to
date with the registered voices before it takes traffic. An error in one check is logged and the
loop goes on: the supervisor never stops while the front end runs.
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

from higgs_serve.cluster.relay.responses import fetch
from higgs_serve.cluster.routing import Router

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
POLL_TIMEOUT_S = 2.0
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)  # after 1st, 2nd, ... consecutive crash
BASE_URL = "http://replica"  # the host part of URLs sent over a replica's Unix socket
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
    """One engine server on the Unix socket `socket_path`. `command` set = a process this front
    end owns (argv from the socket path); None = a server started elsewhere on that socket."""

    id: str
    socket_path: Path
    command: Callable[[Path], list[str]] | None = None
    env: dict[str, str | None] = field(default_factory=dict)  # over the front end's; None removes a variable
    log_path: Path | None = None
    # SIGTERM the server if the thread that started it dies (only where that thread lives as
    # long as the process: the front end's event loop, not a Ray actor's worker threads)
    stop_with_parent: bool = False
    process: subprocess.Popen | None = None
    ready: bool = False
    synced_version: int = -1  # the voice registry's version this replica holds (voice_sync.py)
    restarts: int = 0
    crashes_in_a_row: int = 0
    restart_at: float = 0.0

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)  # a dead predecessor's
        env = {k: v for k, v in {**os.environ, **self.env}.items() if v is not None}
        log = open(self.log_path, "ab") if self.log_path else None  # None: the front end's
        try:
            self.process = subprocess.Popen(self.command(self.socket_path), env=env, stdout=log,
                                            stderr=subprocess.STDOUT if log else None,
                                            start_new_session=True,
                                            preexec_fn=sigterm_with_parent if self.stop_with_parent else None)
        finally:
            if log is not None:
                log.close()
        logger.info("replica %s: started pid %d on %s (%s)", self.id, self.process.pid,
                    self.socket_path,
                    " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in self.env.items())
                    or "inherited env")

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    @property
    def serving(self) -> bool:
        """Ready as last polled and, where this front end owns it, its process alive now."""
        return self.ready and not self.exited

    def client(self, timeout: float | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(self.socket_path)),
                                 base_url=BASE_URL, timeout=timeout)

    def sync_client(self, timeout: float | None = None) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket_path)),
                            base_url=BASE_URL, timeout=timeout)

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
    """Keeps the replicas running and the router's view of them current: one watch loop per
    replica, so a slow or failing replica never delays the others."""

    def __init__(self, replicas: dict[str, Replica], router: Router,
                 sync_voices: Callable[[Replica], Awaitable[None]],
                 voices_version: Callable[[], int] = lambda: 0,
                 poll_interval_s: float = POLL_INTERVAL_S):
        """sync_voices(replica): give it every registered voice (raises on failure);
        voices_version(): the registry's version now (cluster/voice_sync.py)."""
        self.replicas = replicas
        self.router = router
        self.sync_voices = sync_voices
        self.voices_version = voices_version
        self.poll_interval_s = poll_interval_s
        self.clients = {rid: r.client() for rid, r in replicas.items()}
        self.failures: dict[str, str] = {}  # replica -> the error its last check raised

    def start_all(self) -> None:
        for replica in self.replicas.values():
            if replica.command is not None:
                replica.start()

    async def run(self) -> None:
        await asyncio.gather(*(self._watch(r) for r in self.replicas.values()))

    async def _watch(self, replica: Replica) -> None:
        while True:
            await self.check(replica)
            await asyncio.sleep(self.poll_interval_s)

    async def check(self, replica: Replica) -> None:
        """One check of `replica`; any error is logged (its traceback once while it repeats)
        and leaves the replica out of rotation until a check passes."""
        try:
            await self._check(replica)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            said = f"{type(error).__name__}: {error}"
            if self.failures.get(replica.id) != said:
                logger.error("replica %s: its check failed; it is routed around and checked again "
                             "in %g s", replica.id, self.poll_interval_s, exc_info=error)
            else:
                logger.debug("replica %s: its check failed again: %s", replica.id, said)
            self.failures[replica.id] = said
            self.mark_down(replica)
        else:
            if self.failures.pop(replica.id, None) is not None:
                logger.info("replica %s: its check passes again", replica.id)

    def mark_down(self, replica: Replica) -> None:
        """Route around a replica now (its socket refused us), until a poll finds it ready."""
        if replica.ready:
            logger.info("replica %s: out of rotation", replica.id)
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
        path = str(replica.socket_path)
        try:
            ready = (await fetch(path, "/ready", POLL_TIMEOUT_S))[0] == 200
            if ready:
                status, metrics = await fetch(path, "/metrics", POLL_TIMEOUT_S)
                in_flight, kv_usage = parse_load(metrics.decode("utf-8", "replace"))
                self.router.report(replica.id, in_flight=in_flight, kv_usage=kv_usage)
        except (OSError, asyncio.TimeoutError, ValueError):
            ready = False
        if ready and replica.synced_version < self.voices_version():
            ready = await self._sync(replica)
        if ready and not replica.ready:
            logger.info("replica %s: ready on %s", replica.id, replica.socket_path)
            replica.crashes_in_a_row = 0
        elif replica.ready and not ready:
            logger.info("replica %s: not ready; routed around", replica.id)
        replica.ready = ready
        self.router.set_healthy(replica.id, ready)

    async def _sync(self, replica: Replica) -> bool:
        """Every registered voice onto `replica` before it takes traffic; True when it holds the
        registry's version now (a change during the sync: again at the next poll)."""
        if replica.ready:
            self.mark_down(replica)  # it lags (a fan-out failed or raced its start): out until synced
        target = self.voices_version()
        try:
            await self.sync_voices(replica)
        except httpx.HTTPError as error:
            logger.warning("replica %s: voice sync failed (%s); retrying", replica.id, error)
            return False
        replica.synced_version = max(replica.synced_version, target)
        return replica.synced_version >= self.voices_version()

    def _restart_later(self, replica: Replica) -> None:
        code = replica.process.returncode
        delay = RESTART_BACKOFF_S[min(replica.crashes_in_a_row, len(RESTART_BACKOFF_S) - 1)]
        logger.warning("replica %s: exited with %s; restarting it in %g s", replica.id, code, delay)
        self.mark_down(replica)
        replica.process = None
        replica.synced_version = -1
        replica.crashes_in_a_row += 1
        replica.restart_at = asyncio.get_running_loop().time() + delay

    def stop_all(self) -> None:
        """SIGTERM every replica at once, then wait for each (they drain in parallel)."""
        running = [r for r in self.replicas.values() if r.process is not None and not r.exited]
        for replica in running:
            replica.process.terminate()
        for replica in running:
            replica.stop()

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
