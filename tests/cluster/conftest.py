"""The data-parallel front end over two tiny-model CPU replicas (`higgs-serve serve
--data-parallel-size 2 --device cpu`) on loopback, started once for every end-to-end module of
this package that asks for it (test_frontend_e2e*.py)."""

from __future__ import annotations


import os
import subprocess
import sys

import httpx
import pytest

from support.cluster_e2e import SEGMENT_MAX_CHARS, wait_for

from higgs_serve.cluster.replicas import free_port


@pytest.fixture(scope="package")
def cluster(tiny_model_dir, tmp_path_factory):
    """(url, httpx client, front end log) of a ready two-replica front end. Its work directory
    (replica sockets, control socket) is made under `work/tmp`: SIGTERM must leave none behind."""
    work = tmp_path_factory.mktemp("dp")
    (work / "tmp").mkdir()
    port = free_port()
    log = work / "frontend.log"
    command = [sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve",
               str(tiny_model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
               "--data-parallel-size", "2", "--voices-dir", str(work / "voices"),
               "--served-model-name", "higgs-tiny-dp", "--max-queue", "16",
               # the default profile (the deadline policy off): routing, not admission, and one
               # seed's streams compared byte for byte across routes
               "--segment-max-chars", str(SEGMENT_MAX_CHARS)]
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(work / "tmp")})
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=url, timeout=60)
    try:
        wait_for(lambda: http.get("/ready").json().get("replicas_ready") == 2, 240,
                 "2 replicas ready", log)
        yield url, http, log
    finally:
        http.close()
        process.terminate()  # SIGTERM: replicas stopped, work directory removed, exit 0
        try:
            assert process.wait(timeout=60) == 0, log.read_text()[-4000:]
        finally:
            if process.poll() is None:
                process.kill()
        assert list((work / "tmp").iterdir()) == [], "the front end left its work directory"
