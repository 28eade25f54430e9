"""`serve --devices 0,0 --mps`: the private MPS daemons and the replicas' environment.

No CPU machine has NVIDIA's control binary, so these tests put a stand-in `nvidia-cuda-mps-control`
on PATH that behaves as the real one does at its interface: `-f` runs the daemon in the
foreground and makes the control pipe in CUDA_MPS_PIPE_DIRECTORY, a plain call writes its stdin
into that pipe, and `quit` ends the daemon. The real daemon runs in the GPU suite's `scaleout_mps` stage.
"""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from higgs_serve.cli import main
from higgs_serve.cluster.launch import ClusterPlan, make_replicas
from higgs_serve.cluster.mps import CONTROL_BINARY, MpsDaemon, check_mps, shared_gpus, start_daemons, stop_daemons
from higgs_serve.cluster.replicas import Replica
from higgs_serve.errors import HiggsServeError

FAKE_CONTROL = f"""#!{sys.executable}
import os, sys, time
pipe, log = os.environ["CUDA_MPS_PIPE_DIRECTORY"], os.environ["CUDA_MPS_LOG_DIRECTORY"]
control = os.path.join(pipe, "control")
def note(text):
    for path in (os.path.join(log, "control.log"), os.environ.get("FAKE_MPS_NOTES")):
        if path:
            with open(path, "a") as f:
                f.write(text + "\\n")
if sys.argv[1:] == ["-f"]:
    if os.environ.get("FAKE_MPS_FAIL"):
        print("An instance of this daemon is already running")
        sys.exit(1)
    note("start CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"))
    if os.environ.get("FAKE_MPS_NO_PIPE"):
        time.sleep(600)
    os.mkfifo(control)
    while True:
        with open(control) as fifo:
            for line in fifo:
                note("command " + line.strip())
                if line.strip() == "quit":
                    os.unlink(control)
                    sys.exit(0)
with open(control, "w") as fifo:
    fifo.write(sys.stdin.read())
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    binary = bin_dir / CONTROL_BINARY
    binary.write_text(FAKE_CONTROL)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return binary


def test_shared_gpus_are_those_listed_twice():
    assert shared_gpus(("0", "0", "1")) == ["0"]
    assert shared_gpus(("1", "0", "1", "0", "2")) == ["1", "0"]
    assert shared_gpus(("0", "1")) == []


@pytest.mark.parametrize("devices, message", [
    (("cpu", "cpu"), "CPU replicas"),
    (("0", "1"), "several replicas share"),
])
def test_mps_refuses_replicas_it_cannot_serve(devices, message, fake_control):
    with pytest.raises(HiggsServeError, match=message):
        check_mps(devices)


def test_mps_names_the_missing_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HiggsServeError, match=f"needs {CONTROL_BINARY}"):
        check_mps(("0", "0"))


def test_one_daemon_per_shared_gpu_started_and_stopped(fake_control, tmp_path):
    daemons = start_daemons(check_mps(("0", "0", "1")), ("0", "0", "1"), tmp_path / "work")
    try:
        assert list(daemons) == ["0"]
        daemon = daemons["0"]
        process = daemon.process
        control = daemon.directory / "pipe" / "control"
        assert control.exists() and process.poll() is None
        log = daemon.directory / "log" / "control.log"
        assert log.read_text().splitlines() == ["start CUDA_VISIBLE_DEVICES=0"]  # the daemon sees its GPU
        assert daemon.client_env == {"CUDA_VISIBLE_DEVICES": None,
                                     "CUDA_MPS_PIPE_DIRECTORY": str(daemon.directory / "pipe"),
                                     "CUDA_MPS_LOG_DIRECTORY": str(daemon.directory / "log")}
    finally:
        stop_daemons(daemons)
    assert process.poll() == 0 and not control.exists()  # it took quit and ended
    assert log.read_text().splitlines()[-1] == "command quit"
    stop_daemons(daemons)  # a second stop sends nothing
    assert log.read_text().splitlines()[-1] == "command quit"


def test_a_daemon_that_fails_to_start_is_named(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.raises(HiggsServeError, match="exited with 1; it said: An instance of this daemon is already running"):
        start_daemons(str(fake_control), ("0", "0"), tmp_path)


def test_a_control_binary_that_cannot_run_is_named(tmp_path):
    broken = tmp_path / CONTROL_BINARY
    broken.write_text("not a program")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)  # executable, but no interpreter line: exec fails
    with pytest.raises(HiggsServeError, match="did not run"):
        MpsDaemon(str(broken), "0", tmp_path / "d").start()


def test_a_daemon_without_a_control_pipe_is_ended_and_named(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_NO_PIPE", "1")
    daemon = MpsDaemon(str(fake_control), "0", tmp_path / "d")
    with pytest.raises(HiggsServeError, match="made no control pipe in 0.5 s"):
        daemon.start(timeout_s=0.5)
    assert daemon.process is None  # ended, not left running


def test_replicas_on_a_shared_gpu_are_mps_clients(fake_control, tmp_path):
    devices = ("0", "0", "1")
    plan = ClusterPlan(devices, capacity=8, mps=True)
    daemons = start_daemons(check_mps(devices), devices, tmp_path)
    try:
        replicas = make_replicas(plan, "model", [], "INFO", tmp_path, daemons)
    finally:
        stop_daemons(daemons)
    for rid in ("0", "1"):
        assert replicas[rid].env == daemons["0"].client_env
    assert replicas["2"].env == {"CUDA_VISIBLE_DEVICES": "1"}  # alone on GPU 1: no MPS


def test_a_replica_runs_without_a_variable_its_env_removes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    seen = tmp_path / "seen"
    script = f"import os; open({str(seen)!r}, 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"
    replica = Replica(id="0", socket_path=tmp_path / "0.sock",
                      command=lambda path: [sys.executable, "-c", script],
                      env={"CUDA_VISIBLE_DEVICES": None, "CUDA_MPS_PIPE_DIRECTORY": "/p"})
    replica.start()
    assert replica.process.wait(timeout=30) == 0
    assert seen.read_text() == "unset"


@pytest.mark.parametrize("flags, message", [
    (["--device", "cpu", "--mps"], "use it with --devices"),
    (["--device", "cpu", "--data-parallel-size", "2", "--mps"], "CPU replicas"),
])
def test_the_cli_refuses_mps_where_it_cannot_apply(flags, message, tiny_model_dir, capsys):
    assert main(["serve", str(tiny_model_dir), *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_killed_front_end_leaves_no_daemon(fake_control, tmp_path):
    """The daemon is the front end's child with a parent-death signal: SIGKILL the process that
    started it and the daemon ends too (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("parent-death signals are Linux's")
    script = (f"import sys, time; from pathlib import Path; from higgs_serve.cluster.mps import MpsDaemon; "
              f"d = MpsDaemon({str(fake_control)!r}, '0', Path({str(tmp_path / 'd')!r})); d.start(); "
              f"print(d.process.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        daemon_pid = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(daemon_pid):
        assert time.monotonic() < deadline, "the MPS daemon outlived the front end"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) is gone too
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_stops_the_daemons_and_removes_the_work_directory(fake_control, tmp_path):
    """The front end handles SIGTERM itself, so its cleanup runs: the MPS daemon is told to quit
    (not left to the parent-death signal) and the work directory is gone. Its replicas here
    cannot load their model and keep restarting; that does not matter to the shutdown."""
    notes, tmp = tmp_path / "notes", tmp_path / "tmp"
    tmp.mkdir()
    script = ("import socket; from pathlib import Path; "
              "from higgs_serve.cluster.launch import ClusterPlan, run_cluster; "
              "from higgs_serve.server.settings import ServerSettings; "
              "sock = socket.socket(); sock.bind(('127.0.0.1', 0)); sock.listen(); "
              "print(sock.getsockname()[1], flush=True); "
              "run_cluster(ClusterPlan(('0', '0'), capacity=2, mps=True), 'no-such-model', [], "
              f"listener=sock, voices_dir=Path({str(tmp_path / 'voices')!r}), sample_rate_hz=24000, "
              "settings=ServerSettings(), log_level='ERROR')")
    env = {**os.environ, "TMPDIR": str(tmp), "FAKE_MPS_NOTES": str(notes)}
    front = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(front.stdout.readline())
        deadline = time.monotonic() + 30
        while True:  # the front end answers: its signal handlers are in place
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and front.poll() is None, "the front end never served"
            time.sleep(0.05)
        assert "start" in notes.read_text()
        front.send_signal(signal.SIGTERM)
        assert front.wait(timeout=60) == 0
    finally:
        if front.poll() is None:
            front.kill()
    assert notes.read_text().splitlines()[-1] == "command quit"
    assert list(tmp.iterdir()) == []
