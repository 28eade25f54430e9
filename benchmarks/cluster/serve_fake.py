"""Serve the HTTP API over the test suite's fake engine (tests/server/fake_engine.py): no model,
no GPU. Every request streams `--chunk-frames` frames of a deterministic sine every `--delay`
seconds, so the front end and a benchmark client can be measured on their own, e.g. at c = 256:

  PYTHONPATH=src python benchmarks/cluster/serve_fake.py --port 8123 &
  PYTHONPATH=src python benchmarks/serving/bench_serving.py --url http://127.0.0.1:8123 --frames 250 \\
      --concurrency 64 256 --num-requests 512

A stream of F frames then takes F / chunk_frames * delay seconds: with the defaults (25 frames
every 0.4 s) each stream makes 2.5 s of audio a second, and c streams 2.5 c at most.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import uvicorn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "server"))
from fake_engine import FakeEngine, fake_deploy  # noqa: E402

from higgs_serve.server.app import build_app  # noqa: E402
from higgs_serve.server.settings import ServerSettings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--uds", default=None, help="listen on this Unix socket instead of --port "
                                               "(a front end's replica)")
    p.add_argument("--delay", type=float, default=0.4, help="seconds between a stream's chunks")
    p.add_argument("--chunk-frames", type=int, default=25)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--clone", action="store_true",
                   help="accept ref_audio / registered voices (a stand-in encoder: zero codes)")
    args = p.parse_args(argv)
    # frames_per_char is high enough that the request's max_new_tokens, not its text, ends it
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=args.max_num_seqs, max_tokens=4096),
                        chunk_frames=args.chunk_frames, frames_per_char=100, step_delay_s=args.delay)
    settings = ServerSettings(port=args.port, max_queue=args.max_num_seqs + 8,
                              voices_dir=Path(tempfile.mkdtemp(prefix="higgs-fake-voices-")))
    where = {"uds": args.uds} if args.uds else {"host": "127.0.0.1", "port": args.port}
    encoder = (lambda audio: np.zeros((3, 8), np.int64)) if args.clone else None
    uvicorn.run(build_app(engine, settings, reference_encoder=encoder), log_level="warning", **where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
