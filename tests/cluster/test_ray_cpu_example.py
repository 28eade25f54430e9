"""examples/ray_serve_cpu.yaml runs as shipped (issue 50): on a two-core local Ray cluster started
in a folder holding ./tiny-model (what its header tells a reader to make first), `serve run` of
the file, with nothing changed but its HTTP port (a free one: tests never need a fixed port),
serves speech. Skipped only where Ray is not installed; CI installs it (the `test` extra)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from support.cluster_e2e import FIXED, FRAMES, wait_for
from support.ray_cluster import local_ray_cluster

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from higgs_serve.cluster.replicas import free_port  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_serve_cpu.yaml"
SERVE_RUN = "from ray.serve.scripts import cli; cli()"  # the `serve` command of the ray wheel


def _as_shipped_on(port: int, folder: Path) -> Path:
    """The example, its http_options port replaced: the one change."""
    text, replaced = re.subn(r"^(  port: )\d+", rf"\g<1>{port}", EXAMPLE.read_text(), flags=re.M)
    assert replaced == 1
    path = folder / EXAMPLE.name
    path.write_text(text)
    return path


@pytest.mark.timeout(600)  # Serve's controller, proxy and an engine replica start on two cores
def test_the_cpu_example_serves_speech_as_shipped(tiny_model_dir, tmp_path):
    (tmp_path / "tiny-model").symlink_to(tiny_model_dir, target_is_directory=True)
    port = free_port()
    config = _as_shipped_on(port, tmp_path)
    with local_ray_cluster([2], workdir=tmp_path) as cluster:  # `ray start --head --num-cpus 2`
        try:
            done = subprocess.run([sys.executable, "-c", SERVE_RUN, "run", "--non-blocking",
                                   "--address", cluster.address, str(config)],
                                  cwd=tmp_path, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, done.stderr[-3000:]
            http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
            wait_for(lambda: http.get("/ready").status_code == 200, 420, "the example's app ready")
            response = http.post("/v1/audio/speech", json={"input": "Hello from Ray.", **FIXED})
            assert response.status_code == 200, response.text
            samples, rate = sf.read(io.BytesIO(response.content))
            assert rate == 24000 and len(samples) == FRAMES * 960
            http.close()
        finally:
            serve.shutdown()
