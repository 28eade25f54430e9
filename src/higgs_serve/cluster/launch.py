"""`higgs-serve serve --data-parallel-size N | --devices 0,1,...`: N replicas and the front end."""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from higgs_serve.cluster.frontend import Frontend, FrontendSettings, serve_frontend
from higgs_serve.cluster.mps import MpsDaemon, check_mps, start_daemons, stop_daemons
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router
from higgs_serve.errors import HiggsServeError
from higgs_serve.server.settings import ServerSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterPlan:
    """What to start: one replica per entry of `devices` (a CUDA device index, or "cpu")."""

    devices: tuple[str, ...]
    capacity: int                  # requests one replica admits (max_num_seqs + max_queue)
    routing: str = "affinity"
    load_bound: float = 1.5
    mps: bool = False              # replicas sharing a GPU run under a private MPS daemon (mps.py)


def plan_devices(data_parallel_size: int | None, devices: str | None, device: str | None,
                 cuda_count: int) -> tuple[str, ...]:
    """The replicas' devices from the flags. A device may repeat (two engines share a GPU, each
    with its own gpu_memory_utilization share)."""
    if devices:
        if device == "cpu":
            raise HiggsServeError("--devices lists GPUs; with --device cpu use --data-parallel-size")
        listed = tuple(d.strip() for d in devices.split(",") if d.strip())
        if not listed or not all(d.isdigit() for d in listed):
            raise HiggsServeError(f"--devices must be GPU indices like 0,1,2; got {devices!r}")
        if data_parallel_size is not None and data_parallel_size != len(listed):
            raise HiggsServeError(f"--data-parallel-size {data_parallel_size} does not match "
                                  f"--devices {devices} ({len(listed)} devices)")
        missing = [d for d in listed if int(d) >= cuda_count]
        if missing:
            raise HiggsServeError(f"--devices {devices}: this machine has {cuda_count} CUDA "
                                  f"device(s), so {','.join(missing)} do not exist")
        return listed
    if data_parallel_size is None or data_parallel_size < 1:
        raise HiggsServeError(f"--data-parallel-size must be >= 1, got {data_parallel_size}")
    if device == "cpu" or cuda_count == 0:
        return ("cpu",) * data_parallel_size
    if data_parallel_size > cuda_count:
        raise HiggsServeError(f"--data-parallel-size {data_parallel_size} needs as many GPUs; this "
                              f"machine has {cuda_count} (list them with --devices to share one)")
    return tuple(str(i) for i in range(data_parallel_size))


def make_replicas(plan: ClusterPlan, model: str, serve_args: list[str], log_level: str,
                  work_dir: Path, mps: dict[str, MpsDaemon] | None = None) -> dict[str, Replica]:
    """serve_args: the single-server flags every replica gets (not where it listens, its key or
    its voices directory); `mps`: the MPS daemon of each shared GPU (its replicas run as that
    daemon's clients). Each replica listens on a Unix socket in `work_dir` (mode 0700): only
    the front end reaches it. It runs through `higgs_serve.cli_replica`, the CLI with the
    supervisor's polls kept out of its access log."""
    replicas = {}
    for index, device in enumerate(plan.devices):
        voices_dir = work_dir / f"replica-{index}-voices"

        def command(socket_path: Path, voices_dir=voices_dir, device=device) -> list[str]:
            return [sys.executable, "-m", "higgs_serve.cli_replica", "--log-level", log_level,
                    "serve", model, "--uds", str(socket_path), "--voices-dir", str(voices_dir),
                    "--device", "cpu" if device == "cpu" else "cuda", *serve_args]

        env: dict[str, str | None] = {} if device == "cpu" else {"CUDA_VISIBLE_DEVICES": device}
        if mps and device in mps:
            env = mps[device].client_env
        replicas[str(index)] = Replica(id=str(index), socket_path=work_dir / f"replica-{index}.sock",
                                       command=command, env=env, stop_with_parent=True)
    return replicas


def run_cluster(plan: ClusterPlan, model: str, serve_args: list[str], *, listener: socket.socket,
                voices_dir: Path, sample_rate_hz: int, settings: ServerSettings,
                log_level: str) -> None:
    """Serve the front end on `listener` until SIGINT/SIGTERM; the replicas, the MPS daemons and
    the work directory go with it (the signal is handled here, so this cleanup always runs)."""
    work_dir = Path(tempfile.mkdtemp(prefix="higgs-serve-dp-"))  # mode 0700: private sockets
    daemons: dict[str, MpsDaemon] = {}
    try:
        if plan.mps:
            daemons = start_daemons(check_mps(plan.devices), plan.devices, work_dir)
        replicas = make_replicas(plan, model, serve_args, log_level, work_dir, daemons)
        router = Router({rid: plan.capacity for rid in replicas}, policy=plan.routing,
                        load_bound=plan.load_bound)
        frontend = Frontend(replicas, router, voices_dir, sample_rate_hz,
                            FrontendSettings.of(settings))
        logger.info("data parallel: %d replicas on %s, routing %s%s", len(replicas),
                    ",".join(plan.devices), plan.routing, ", MPS on " + ",".join(daemons) if daemons else "")
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve_until_signal(frontend, listener, work_dir))
    finally:
        stop_daemons(daemons)  # after the replicas: the control plane's shutdown stopped them
        shutil.rmtree(work_dir, ignore_errors=True)


async def _serve_until_signal(frontend: Frontend, listener: socket.socket, work_dir: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host, port = listener.getsockname()[:2]
    await serve_frontend(frontend, listener, work_dir, stop, on_started=lambda: logger.info(
        "front end listening on http://%s:%d; /ready answers 200 once a replica is ready", host, port))


def _loop_factory():
    """uvloop where installed (its transports cost the relay less CPU per byte), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
