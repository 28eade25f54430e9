"""The control plane's supervisor over stand-in replica processes (support/tiny_replica.py: real
processes on Unix sockets, started in milliseconds): it survives any error in one check (logged
once, the replica routed around, the loop going on), a killed replica is not ready from the
moment it died and is restarted, a voice registered while a restarted replica is being resynced
reaches that replica, and its polls log nothing at INFO."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from support.cluster_e2e import tone_clip
from support.frontend_thread import frontend_thread, wait_until

from higgs_serve.cli_replica import PollsAtDebug
from higgs_serve.cluster.frontend import Frontend, FrontendSettings
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router

TINY = Path(__file__).resolve().parents[1] / "support" / "tiny_replica.py"


def _frontend(tmp_path: Path, count: int = 2, poll_interval_s: float = 0.05) -> Frontend:
    def command(socket_path: Path) -> list[str]:
        return [sys.executable, str(TINY), str(socket_path)]

    replicas = {str(i): Replica(id=str(i), socket_path=tmp_path / f"r{i}.sock", command=command)
                for i in range(count)}
    return Frontend(replicas, Router({rid: 4 for rid in replicas}), tmp_path / "voices", 24000,
                    FrontendSettings(), poll_interval_s=poll_interval_s)


async def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


def _voices_on(replica: Replica) -> list[str]:
    with replica.sync_client(timeout=5) as client:
        return [v["name"] for v in client.get("/v1/audio/voices").json()["data"]]


def test_the_supervisor_survives_errors_in_its_checks(tmp_path, caplog):
    frontend = _frontend(tmp_path)
    supervisor = frontend.supervisor
    real_sync = frontend.sync_voices
    injected = [FileNotFoundError("voice deleted meanwhile"), FileNotFoundError("voice deleted meanwhile"),
                RuntimeError("anything at all")]

    async def flaky_sync(replica: Replica) -> None:
        if injected:
            raise injected.pop(0)
        await real_sync(replica)

    supervisor.sync_voices = flaky_sync

    async def scenario() -> None:
        supervisor.start_all()
        running = asyncio.create_task(supervisor.run())
        try:
            await _until(lambda: len(frontend.ready_replicas()) == 2)
            assert not injected and not running.done()  # every error seen, the loop still going
            victim = frontend.replicas["0"]
            os.kill(victim.process.pid, signal.SIGKILL)
            victim.process.wait()
            assert not victim.serving  # from the moment it died, before the next poll
            await _until(lambda: victim.restarts == 1 and victim.serving)
            assert not running.done()
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            supervisor.stop_all()
            await supervisor.aclose()

    with caplog.at_level(logging.INFO, logger="higgs_serve.cluster"):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if "its check failed" in r.getMessage()]
    # each distinct error once with its traceback (a repeat goes to DEBUG), never silence
    assert [r.exc_info[0] for r in failures if r.levelno == logging.ERROR] and \
        {r.exc_info[0] for r in failures} <= {FileNotFoundError, RuntimeError}
    assert any("exited with" in r.getMessage() for r in caplog.records)


def test_a_voice_registered_during_a_resync_reaches_the_replica(tmp_path):
    frontend = _frontend(tmp_path, count=1)
    supervisor, replica = frontend.supervisor, frontend.replicas["0"]
    real_sync = frontend.sync_voices

    async def sync_then_register(target: Replica) -> None:
        await real_sync(target)  # the replica's list is read and pushed ...
        # ... and then a voice arrives while it is still not ready: the fan-out skips it
        await asyncio.to_thread(frontend.voices.register, "late", tone_clip((300, 0.3)))

    async def scenario() -> None:
        supervisor.start_all()
        try:
            supervisor.sync_voices = sync_then_register
            await _until_check(supervisor, replica)
            assert not replica.ready  # it lags the registry: not in rotation
            supervisor.sync_voices = real_sync
            await supervisor.check(replica)
            assert replica.ready and replica.synced_version == frontend.voices.version
            assert await asyncio.to_thread(_voices_on, replica) == ["late"]
        finally:
            supervisor.stop_all()
            await supervisor.aclose()

    asyncio.run(scenario())


async def _until_check(supervisor, replica: Replica) -> None:
    """Checks until the replica answers (its server may still be binding)."""
    for _ in range(200):
        await supervisor.check(replica)
        if replica.synced_version >= 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the replica never answered")


def test_health_shows_a_killed_replica_at_once_and_polls_log_nothing(tmp_path, caplog):
    frontend = _frontend(tmp_path, poll_interval_s=0.05)
    with caplog.at_level(logging.INFO):
        with frontend_thread(frontend, tmp_path) as url:
            http = httpx.Client(base_url=url, timeout=10)
            wait_until(lambda: http.get("/ready").json()["replicas_ready"] == 2, what="2 ready")
            caplog.clear()
            polled = sum(1 for _ in range(20) if http.get("/health").status_code == 200)
            assert polled == 20
            # dozens of polls ran meanwhile: none is an INFO line (httpx's or ours)
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
            frontend.supervisor.poll_interval_s = 60  # the next poll is far away now
            time.sleep(0.2)  # every watch loop is in its 60 s sleep now
            victim = frontend.replicas["1"]
            pid = victim.process.pid
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: victim.exited, what="the kill")
            listed = {r["id"]: r for r in http.get("/health").json()["replicas"]}
            assert listed["1"]["ready"] is False
            # public: counts and states only, never a private socket or a pid (the log has them)
            assert set(listed["1"]) == {"id", "ready", "restarts", "in_flight"}
            assert http.get("/ready").json()["replicas_ready"] == 1


def test_replica_access_logs_keep_the_polls_at_debug():
    def record(method: str, path: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                                 '%s - "%s %s HTTP/%s" %d', ("", method, path, "1.1", 200), None)

    keep = PollsAtDebug()
    root = logging.getLogger()
    level = root.level
    try:
        root.setLevel(logging.INFO)
        assert not keep.filter(record("GET", "/ready")) and not keep.filter(record("GET", "/metrics"))
        assert keep.filter(record("POST", "/v1/audio/speech"))
        root.setLevel(logging.DEBUG)
        assert keep.filter(record("GET", "/ready"))
    finally:
        root.setLevel(level)
