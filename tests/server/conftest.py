"""Server test fixtures (helpers in live_server.py, the fake engine in fake_engine.py)."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine, fake_deploy
from live_server import fake_settings, start_threaded_server

from support import browser


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory):
    """One server per module: fake engine with 2 slots + 1 queued = 3 requests in flight."""
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=2, max_tokens=200))
    live = start_threaded_server(engine, fake_settings(tmp_path_factory.mktemp("srv")))
    yield live
    live.stop()


@pytest.fixture(scope="session")
def peer_server(tiny_model_dir, tmp_path_factory):
    """The real server of the peer-compatibility tests (peer_server.py), shared by their modules."""
    from peer_server import start_peer_server

    with start_peer_server(tiny_model_dir, tmp_path_factory.mktemp("peer_server")) as server:
        yield server


def pytest_terminal_summary(terminalreporter):
    """The playground's browser tests (test_playground_browser.py) skip without Chromium: the
    run says so in one line, with how to install it."""
    reasons = {report.longrepr[2].removeprefix("Skipped: ")
               for report in terminalreporter.stats.get("skipped", [])
               if isinstance(report.longrepr, tuple) and browser.SKIP_PREFIX in report.longrepr[2]}
    for reason in sorted(reasons):
        terminalreporter.write_line(reason)
