"""The server bench_serving.py measures, in a subprocess: its command line, its start (ready when
GET /ready answers 200; the log's tail when it dies first) and its stop (SIGTERM, then kill)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import REPO_ROOT  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "higgs_serve.cli", "--log-level", args.server_log_level, "serve", args.model,
           "--host", "127.0.0.1", "--port", str(port), "--load-format", args.load_format,
           "--max-queue", str(max(args.concurrency) + 8)]
    if args.deploy_config:
        cmd += ["--deploy-config", args.deploy_config]
    if args.device:
        cmd += ["--device", args.device]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    if args.watermark:
        cmd += ["--watermark", args.watermark]
    return cmd + args.server_arg


def _log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log_path: Path) -> float:
    """Seconds until GET /ready answered 200; exits with the log's tail if the server died."""
    t0 = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"bench_serving: the server exited with {proc.returncode} before it was ready; "
                             f"log {log_path}:\n{_log_tail(log_path)}")
        try:
            if httpx.get(f"{url}/ready", timeout=5.0).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass  # not listening yet
        if time.perf_counter() - t0 > timeout_s:
            raise SystemExit(f"bench_serving: the server was not ready after {timeout_s:.0f} s; "
                             f"log {log_path}:\n{_log_tail(log_path)}")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: uvicorn shuts down gracefully
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str, Path, list[str]]:
    """The server for bench_serving's `args`, its output to `--server-log` (or a temp file):
    (process, its URL, the log, the command)."""
    port = args.port or free_port()
    log_path = Path(args.server_log or tempfile.mkstemp(prefix="bench_serving_", suffix=".log")[1])
    env = dict(os.environ)
    # the server imports higgs_serve from src/ when the package is not installed (GPU machine)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO_ROOT / "src")) if p)
    cmd = server_command(args, port)
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}", log_path, cmd
