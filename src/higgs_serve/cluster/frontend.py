"""The one-host front end over N engine replicas: a data plane and a control plane, one process.

- Data plane (cluster/relay/): the public HTTP/1.1 listener. Checks the key and body limits,
  routes speech by cluster/routing.py and relays it byte for byte over each replica's private
  Unix socket; passes everything else to the control plane.
- Control plane (cluster/control.py): a FastAPI app on a private Unix socket in the work
  directory: voices (cluster/voice_sync.py), health, metrics, models, the WebSocket relay
  (cluster/relay/ws_relay.py); its lifespan runs the replicas and their supervisor (cluster/replicas.py).

Both run on one event loop and share one `Router`, so routing state is exact (no copies to keep
in step). Either side can be measured alone (benchmarks/cluster/bench_relay.py drives the data plane over
fake replicas) and replaced alone: the relay only needs the router, the replicas' sockets,
`mark_down` and the control plane's socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn

from higgs_serve.cluster.control import build_control_app
from higgs_serve.cluster.relay.listener import Relay
from higgs_serve.cluster.state import Frontend, FrontendSettings

__all__ = ["Frontend", "FrontendSettings", "serve_frontend"]

logger = logging.getLogger(__name__)


class _ControlServer(uvicorn.Server):
    """uvicorn for the control plane. The front end handles SIGINT/SIGTERM itself (it drains the
    relay first), so this server installs no signal handlers and never re-raises a signal."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def serve_frontend(frontend: Frontend, listener: socket.socket, work_dir: Path,
                         stop: asyncio.Event, on_started: Callable[[], None] | None = None) -> None:
    """Serve on `listener` until `stop` is set; then shut down in order: the relay stops
    accepting and lets requests in progress finish (graceful_shutdown_s), then the control plane
    stops (closing WebSocket sessions), its lifespan stopping the supervisor and the replicas."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per supervisor poll
    grace_s = frontend.settings.graceful_shutdown_s
    control_socket = work_dir / "control.sock"
    control = _ControlServer(uvicorn.Config(
        build_control_app(frontend), uds=str(control_socket), lifespan="on", access_log=False,
        log_level="warning", timeout_graceful_shutdown=grace_s))
    control_run = asyncio.create_task(control.serve())
    while not control.started:
        if control_run.done():
            await control_run  # its start failed: raise why
            raise RuntimeError("the front end's control plane stopped while starting")
        await asyncio.sleep(0.01)
    relay = Relay(frontend, control_socket)
    try:
        await relay.start(listener)
        if on_started is not None:
            on_started()
        await stop.wait()
        logger.info("front end: stopping (requests in progress get up to %d s)", grace_s)
        await relay.drain(grace_s)
    finally:
        control.should_exit = True
        await control_run
        relay.close()
