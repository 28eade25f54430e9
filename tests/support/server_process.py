"""A `higgs-serve serve` subprocess as the example tests run one (tests/unit/test_cli_examples.py,
tests/unit/test_docs_examples.py): a free loopback port, wait for /ready, stop with SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float = 120) -> None:
    """Until `url`/ready answers 200; fails with the server's stderr if it exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"server exited: {proc.stderr.read() if proc.stderr else ''}"
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} not ready after {timeout_s} s"
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, up to 30 s to exit, then SIGKILL."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
