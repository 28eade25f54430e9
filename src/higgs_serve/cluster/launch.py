"""`higgs-serve serve --data-parallel-size N | --devices 0,1,...`: N replicas and the front end."""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from higgs_serve.cluster.frontend import Frontend, FrontendSettings, build_frontend
from higgs_serve.cluster.mps import MpsDaemon, check_mps, start_daemons, stop_daemons
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router
from higgs_serve.errors import HiggsServeError

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
    """serve_args: the single-server flags every replica gets (not host/port/voices-dir); `mps`:
    the MPS daemon of each shared GPU (its replicas run as that daemon's clients)."""
    replicas = {}
    for index, device in enumerate(plan.devices):
        voices_dir = work_dir / f"replica-{index}-voices"

        def command(port: int, voices_dir=voices_dir, device=device) -> list[str]:
            return [sys.executable, "-m", "higgs_serve.cli", "--log-level", log_level, "serve",
                    model, "--host", "127.0.0.1", "--port", str(port),
                    "--voices-dir", str(voices_dir), "--device", "cpu" if device == "cpu" else "cuda",
                    *serve_args]

        env: dict[str, str | None] = {} if device == "cpu" else {"CUDA_VISIBLE_DEVICES": device}
        if mps and device in mps:
            env = mps[device].client_env
        replicas[str(index)] = Replica(id=str(index), command=command, env=env,
                                       stop_with_parent=True)
    return replicas


def run_cluster(plan: ClusterPlan, model: str, serve_args: list[str], *, host: str, port: int,
                voices_dir: Path, sample_rate_hz: int, api_key: str | None, log_level: str,
                max_input_chars: int, graceful_shutdown_s: int = 30) -> None:
    """Serve the front end until SIGINT/SIGTERM; the replicas stop with it."""
    work_dir = Path(tempfile.mkdtemp(prefix="higgs-serve-dp-"))
    daemons: dict[str, MpsDaemon] = {}
    try:
        if plan.mps:
            daemons = start_daemons(check_mps(plan.devices), plan.devices, work_dir)
        replicas = make_replicas(plan, model, serve_args, log_level, work_dir, daemons)
        router = Router({rid: plan.capacity for rid in replicas}, policy=plan.routing,
                        load_bound=plan.load_bound)
        frontend = Frontend(replicas, router, voices_dir, sample_rate_hz,
                            FrontendSettings(api_key=api_key, graceful_shutdown_s=graceful_shutdown_s,
                                             max_input_chars=max_input_chars))
        logger.info("data parallel: %d replicas on %s, routing %s%s", len(replicas),
                    ",".join(plan.devices), plan.routing, ", MPS on " + ",".join(daemons) if daemons else "")
        config = uvicorn.Config(build_frontend(frontend), host=host, port=port, lifespan="on",
                                timeout_graceful_shutdown=graceful_shutdown_s, log_level="info")
        uvicorn.Server(config).run()
    finally:
        stop_daemons(daemons)  # after the replicas: the front end's shutdown stopped them
        shutil.rmtree(work_dir, ignore_errors=True)
