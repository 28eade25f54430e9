"""NVIDIA MPS for replicas that share a GPU (`serve --devices 0,0 --mps`).

Processes on one GPU without MPS take turns on it in time slices: two engines sharing an H200
served 0.73-0.75x of one engine alone (benchmarks/results, scaleout_shared_gpu_h200.json). Under
MPS their kernels run on the GPU at the same time, which pays where one engine leaves the GPU idle
between launches (host-bound steps). sglang-omni runs its same-GPU replicas this way.

The front end starts one private MPS control daemon per shared GPU and stops it after the
replicas: the daemon's pipe and log directories live in the front end's work directory, so it
needs no system-wide daemon and never touches one, and no device setting (compute mode, clocks)
changes. The daemon runs with CUDA_VISIBLE_DEVICES naming its GPU; the MPS server shows that GPU
to its clients as device 0, so the replicas on it run with CUDA_VISIBLE_DEVICES unset (NVIDIA's MPS
documentation: a client keeping the physical index would fail) and with the daemon's directories
in CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY. A GPU that only one replica uses runs it
without MPS.

A CUDA client that cannot reach its daemon runs without MPS and says nothing, so the start waits
for the daemon's control pipe and fails loudly when it does not appear. The daemon runs in the
foreground as the front end's child (SIGTERM when the front end dies, as the replicas get), so a
killed front end leaves no daemon behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from higgs_serve.cluster.replicas import sigterm_with_parent
from higgs_serve.errors import HiggsServeError

logger = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 30.0


def shared_gpus(devices: Sequence[str]) -> list[str]:
    """The GPUs that more than one replica uses, in first-listed order."""
    counts = Counter(d for d in devices if d != "cpu")
    return [d for d in dict.fromkeys(devices) if counts.get(d, 0) > 1]


def check_mps(devices: Sequence[str]) -> str:
    """The control binary's path, or the reason `--mps` cannot serve these replicas."""
    if "cpu" in devices:
        raise HiggsServeError("--mps shares a GPU between engine processes; CPU replicas have none")
    if not shared_gpus(devices):
        raise HiggsServeError(f"--mps needs a GPU that several replicas share (list it more than once, "
                              f"e.g. --devices 0,0); got {','.join(devices)}")
    binary = shutil.which(CONTROL_BINARY)
    if binary is None:
        raise HiggsServeError(f"--mps needs {CONTROL_BINARY} (the NVIDIA driver's utilities) on PATH")
    return binary


@dataclass
class MpsDaemon:
    """One private MPS control daemon, serving one GPU (module note). It runs in the foreground
    (`-f`) as the front end's child, so it also ends when the front end is killed."""

    binary: str
    gpu: str
    directory: Path
    process: subprocess.Popen | None = None

    @property
    def client_env(self) -> dict[str, str | None]:
        """What a replica on this GPU runs with (None: the variable is removed)."""
        return {"CUDA_VISIBLE_DEVICES": None,
                "CUDA_MPS_PIPE_DIRECTORY": str(self.directory / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(self.directory / "log")}

    @property
    def _control(self) -> Path:
        return self.directory / "pipe" / "control"

    @property
    def _output(self) -> Path:
        return self.directory / "log" / "daemon.out"

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **{k: v for k, v in self.client_env.items() if v is not None}}
        env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the daemon and wait for its control pipe."""
        for sub in ("pipe", "log"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        with open(self._output, "ab") as out:
            try:
                self.process = subprocess.Popen([self.binary, "-f"], env=self._env(), stdin=subprocess.DEVNULL,
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                                preexec_fn=sigterm_with_parent)
            except OSError as exc:
                raise HiggsServeError(f"{CONTROL_BINARY} for GPU {self.gpu} did not run: {exc}") from exc
        deadline = time.monotonic() + timeout_s
        while not self._control.exists():
            code = self.process.poll()
            if code is not None or time.monotonic() > deadline:
                self.stop()
                said = self._output.read_text(errors="replace").strip()[-500:] or "nothing"
                why = f"exited with {code}" if code is not None else f"made no control pipe in {timeout_s:g} s"
                raise HiggsServeError(f"the MPS control daemon for GPU {self.gpu} {why}; it said: {said}")
            time.sleep(0.05)
        logger.info("MPS: control daemon for GPU %s up (pid %d, pipes in %s)", self.gpu, self.process.pid,
                    self.directory / "pipe")

    def command(self, line: str, timeout_s: float = STOP_TIMEOUT_S) -> str:
        """One control command (`get_server_list`, `quit`, ...); returns its answer."""
        done = subprocess.run([self.binary], input=line + "\n", env=self._env(), capture_output=True,
                              text=True, timeout=timeout_s, check=False)
        return done.stdout.strip()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask the daemon to quit (it stops its MPS server once the clients are gone); end it if
        it does not, or if it never made its control pipe."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        if self._control.exists():
            try:
                self.command("quit", timeout_s)
                process.wait(timeout=timeout_s)
                return
            except (OSError, subprocess.SubprocessError) as exc:
                logger.warning("MPS: the daemon for GPU %s did not quit: %s", self.gpu, exc)
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_daemons(binary: str, devices: Sequence[str], work_dir: Path) -> dict[str, MpsDaemon]:
    """One started daemon per shared GPU, keyed by GPU; none left running if one fails."""
    daemons: dict[str, MpsDaemon] = {}
    try:
        for gpu in shared_gpus(devices):
            daemon = MpsDaemon(binary, gpu, work_dir / f"mps-gpu{gpu}")
            daemons[gpu] = daemon
            daemon.start()
    except BaseException:
        stop_daemons(daemons)
        raise
    return daemons


def stop_daemons(daemons: dict[str, MpsDaemon]) -> None:
    for daemon in daemons.values():
        daemon.stop()
