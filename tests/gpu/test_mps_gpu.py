"""`serve --mps` on a real GPU: the private control daemon (cluster/mps.py) serves two CUDA
processes on GPU 0 at once, and nvidia-smi lists the MPS server while they run.

Run by the GPU suite's `scaleout_mps` stage before its benchmark (the `tests` stage leaves it
out: a machine whose container cannot run MPS should not stop the other GPU tests). Skipped where
the driver's utilities are not installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from higgs_serve.cluster.mps import CONTROL_BINARY, check_mps, start_daemons, stop_daemons

pytestmark = pytest.mark.skipif(shutil.which(CONTROL_BINARY) is None or shutil.which("nvidia-smi") is None,
                                reason=f"needs {CONTROL_BINARY} and nvidia-smi")

# a client: a context on the MPS server's one device, a GEMM, then it waits for stdin to close
CLIENT = ("import sys, torch; x = torch.randn(1024, 1024, device='cuda'); y = (x @ x).sum().item(); "
          "print(torch.cuda.device_count(), flush=True); sys.stdin.read()")


def _compute_apps() -> str:
    return subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30).stdout


def test_two_clients_share_gpu0_through_the_private_daemon(tmp_path: Path):
    daemons = start_daemons(check_mps(("0", "0")), ("0", "0"), tmp_path)
    clients = []
    try:
        env = {k: v for k, v in {**os.environ, **daemons["0"].client_env}.items() if v is not None}
        for _ in range(2):
            clients.append(subprocess.Popen([sys.executable, "-c", CLIENT], env=env, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True))
        # each sees exactly one device: the MPS server's remapped GPU 0
        assert [c.stdout.readline().strip() for c in clients] == ["1", "1"]
        assert "nvidia-cuda-mps-server" in _compute_apps()
    finally:
        for client in clients:
            client.stdin.close()
            client.wait(timeout=60)
        stop_daemons(daemons)
    assert all(client.returncode == 0 for client in clients)
