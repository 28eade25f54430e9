"""Issue 27 item 1: `higgs-serve serve` stops when asked, also while the model loads, and a port
already in use ends the command at once with one line.

Real subprocesses of the installed CLI. The load must be slow enough to interrupt: a tiny
model's config widened to a 16-layer, 1024-wide talker with `--load-format dummy` takes several
seconds to build and warm up on CPU (and under 1 GB), so the signal lands mid-load.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from higgs_serve.model.tiny import write_tiny_model

STOP_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def slow_model_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("slow_model")
    write_tiny_model(directory, config_only=True)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["text_config"].update(hidden_size=1024, num_hidden_layers=16, num_attention_heads=8,
                                 num_key_value_heads=4, head_dim=128, intermediate_size=3072)
    config_path.write_text(json.dumps(config))
    return directory


def _serve(model_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "higgs_serve.cli", "serve", str(model_dir), "--host", "127.0.0.1",
            "--device", "cpu", *args]


def test_port_in_use_exits_at_once_with_one_line(tiny_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        proc = subprocess.run(_serve(tiny_model_dir, "--port", str(port)), capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - t0
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"higgs-serve: error: port {port} on 127.0.0.1 is already in use (another higgs-serve or other server?): "
        "stop it or choose another --port"]
    assert elapsed < STOP_WITHIN_S, f"took {elapsed:.1f} s"


@pytest.mark.parametrize(("sig", "returncode"), [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)],
                         ids=["SIGINT", "SIGTERM"])
def test_signal_during_model_load_exits_at_once(slow_model_dir, sig, returncode):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_serve(slow_model_dir, "--port", "0", "--load-format", "dummy", "--log-level", "INFO"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen = []
    try:
        for line in proc.stderr:  # wait until the weights are being built: the load is under way
            seen.append(line)
            if "building random weights" in line:
                break
        else:
            pytest.fail("the server exited before it began to load:\n" + "".join(seen))
        t0 = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        elapsed = time.monotonic() - t0
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(seen) + rest
    assert proc.returncode == returncode, log
    assert elapsed < STOP_WITHIN_S, f"took {elapsed:.1f} s to stop:\n{log}"
    assert "engine ready" not in log and "KV cache:" not in log, log  # stopped mid-load, not after
    assert "Traceback" not in log, log
    if sig == signal.SIGINT:
        assert log.rstrip().endswith("higgs-serve: interrupted")
