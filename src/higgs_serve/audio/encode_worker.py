"""An encoder process: the server's CPU-heavy response encoding, away from its GIL
(docs/architecture.md#encoder-processes).

    python -m higgs_serve.audio.encode_worker --fd FD --parent-pid PID

The server (server/last_mile/encode_pool.py) starts a few of these, each on one end of a Unix socket pair
(FD). A process holds the `EncodePipeline` of every response assigned to it (sticky: a
response's codec state lives here from its first chunk to its last) and answers each call in
the order it came (audio/encode_wire.py). One thread: the process is one core's worth of
encoding, and the pool has as many processes as the host should spend on it.

It ends when the server closes its socket (shutdown), when the server dies (the socket reads
EOF; on Linux the kernel also sends SIGTERM: PR_SET_PDEATHSIG), or when its start-up check
fails (every codec opened and fed 40 ms, before it says it is ready).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import time

import numpy as np

from higgs_serve.audio import encode_wire as wire
from higgs_serve.audio.encode_pipeline import EncodePipeline, EncodeSpec
from higgs_serve.audio.encoders import CPU_HEAVY_FORMATS

_PR_SET_PDEATHSIG = 1
_READ_BUFFER_BYTES = 256 << 10
CHECK_RATE_HZ = 24_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m higgs_serve.audio.encode_worker")
    parser.add_argument("--fd", type=int, required=True, help="this process's end of the socket pair")
    parser.add_argument("--parent-pid", type=int, required=True, help="the server's pid")
    args = parser.parse_args(argv)
    _end_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server says when to stop (EOF)
    with socket.socket(fileno=args.fd) as sock:
        return serve(sock)


def _end_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when the thread that started it (the server's event loop) ends, and
    end now if the server is already gone (it died before the request was made)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        sys.exit(0)


def serve(sock: socket.socket) -> int:
    """Check, say ready, then answer calls until the server closes the socket."""
    try:
        report = startup_check()
    except Exception as error:  # noqa: BLE001: the reason goes to the server, which refuses to start
        _send(sock, wire.READY_CALL_ID, wire.FAILED, _describe(error).encode())
        return 1
    _send(sock, wire.READY_CALL_ID, wire.OK, json.dumps(report).encode())
    streams = Streams()
    with sock.makefile("rb", buffering=_READ_BUFFER_BYTES) as reader:
        while True:
            header = reader.read(wire.CALL.size)
            if len(header) < wire.CALL.size:
                return 0  # EOF: the server closed the socket or is gone
            call_id, stream_id, op, size = wire.CALL.unpack(header)
            payload = reader.read(size) if size else b""
            if len(payload) < size:
                return 0
            answer = streams.handle(stream_id, op, payload)
            if answer is not None:
                _send(sock, call_id, *answer)


class Streams:
    """The pipelines of the responses assigned to this process, by stream id."""

    def __init__(self):
        self._pipelines: dict[int, EncodePipeline] = {}
        self._failed: dict[int, str] = {}  # an OPEN that failed: the answer to its next call

    def handle(self, stream_id: int, op: int, payload: bytes) -> tuple[int, bytes] | None:
        """One call -> (status, reply payload), or None for the calls without a reply."""
        if op == wire.OPEN:
            try:
                self._pipelines[stream_id] = EncodePipeline(EncodeSpec.from_json(payload))
            except Exception as error:  # noqa: BLE001: told to the response at its next call
                self._failed[stream_id] = _describe(error)
            return None
        if op == wire.DROP:
            self._pipelines.pop(stream_id, None)
            self._failed.pop(stream_id, None)
            return None
        if stream_id in self._failed:
            return wire.FAILED, self._failed.pop(stream_id).encode()
        pipeline = self._pipelines.get(stream_id)
        if pipeline is None or op not in (wire.PUSH, wire.CLOSE):
            return wire.FAILED, f"no open stream {stream_id} for op {op}".encode()
        last = op == wire.CLOSE
        try:
            data = pipeline.convert(np.frombuffer(payload, dtype=wire.SAMPLE_DTYPE), last)
            if last:
                data = wire.close_reply(data, pipeline.patches())
        except Exception as error:  # noqa: BLE001: this response fails; the others go on
            self._pipelines.pop(stream_id, None)
            return wire.FAILED, _describe(error).encode()
        if last:
            del self._pipelines[stream_id]
        return wire.OK, data

    def __len__(self) -> int:
        return len(self._pipelines)


def startup_check() -> dict:
    """Open every codec (and the time stretch) and encode 40 ms with each: a process that
    cannot (PyAV or a codec missing) fails here, before the server takes a request."""
    started = time.perf_counter()
    tone = (0.1 * np.sin(2 * np.pi * 440 * np.arange(CHECK_RATE_HZ // 25) / CHECK_RATE_HZ)).astype(np.float32)
    checks = [EncodeSpec(fmt, CHECK_RATE_HZ, CHECK_RATE_HZ) for fmt in sorted(CPU_HEAVY_FORMATS)]
    checks.append(EncodeSpec("pcm", CHECK_RATE_HZ, CHECK_RATE_HZ, speed=1.25))
    for spec in checks:
        if not EncodePipeline(spec).convert(tone, last=True):
            raise RuntimeError(f"the {spec.response_format} encoder returned nothing for 40 ms of audio")
    return {"pid": os.getpid(), "formats": sorted(CPU_HEAVY_FORMATS),
            "check_ms": round(1e3 * (time.perf_counter() - started), 1)}


def _send(sock: socket.socket, call_id: int, status: int, payload: bytes) -> None:
    sock.sendall(wire.REPLY.pack(call_id, status, len(payload)) + payload)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


if __name__ == "__main__":
    sys.exit(main())
