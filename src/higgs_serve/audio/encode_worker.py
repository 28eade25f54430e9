"""An encoder process: the server's CPU-heavy response encoding, away from its GIL
(docs/architecture.md#encoder-processes).

    python -m higgs_serve.audio.encode_worker --fd FD --parent-pid PID [--nice N --cpus LIST]

The server (server/last_mile/encode_pool.py) starts a few of these, each on one end of a Unix socket pair
(FD). A process holds the `EncodePipeline` of every response assigned to it (sticky: a
response's codec state lives here from its first chunk to its last) and answers each call in
the order it came (audio/encode_wire.py). One thread: the process is one core's worth of
encoding, and the pool has as many processes as the host should spend on it.

It ends when the server closes its socket (shutdown), when the server dies (the socket reads
EOF; on Linux the kernel also sends SIGTERM: PR_SET_PDEATHSIG), when its start-up check fails
(every codec opened and fed 40 ms, before it says it is ready), or when the server kills it for
not answering (encode_pool.py's watchdog).

Its first act is its placement (config/worker_processes.py: a lower priority, maybe a CPU set
away from the engine's cores). It answers what has arrived in one write: the calls read in one
receive are encoded in order and their replies sent together, unless the first has waited
REPLY_HOLD_S (a batch of cheap first chunks costs the server one read, not one each).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import numpy as np

from higgs_serve.audio import encode_wire as wire
from higgs_serve.audio.encode_pipeline import EncodePipeline, EncodeSpec
from higgs_serve.audio.encoders import CPU_HEAVY_FORMATS
from higgs_serve.config.worker_processes import worker_start

_RECEIVE_BYTES = 256 << 10
REPLY_HOLD_S = 0.005  # the longest a reply waits for the ones after it
CHECK_RATE_HZ = 24_000


def main(argv: list[str] | None = None) -> int:
    fd = worker_start("higgs_serve.audio.encode_worker", argv)
    with socket.socket(fileno=fd) as sock:
        return serve(sock)


def serve(sock: socket.socket) -> int:
    """Check, say ready, then answer calls until the server closes the socket."""
    try:
        report = startup_check()
    except Exception as error:  # noqa: BLE001: the reason goes to the server, which refuses to start
        _send(sock, wire.READY_CALL_ID, wire.FAILED, _describe(error).encode())
        return 1
    _send(sock, wire.READY_CALL_ID, wire.OK, json.dumps(report).encode())
    streams, inbox = Streams(), bytearray()
    while True:
        received = sock.recv(_RECEIVE_BYTES)
        if not received:
            return 0  # EOF: the server closed the socket or is gone
        inbox += received
        del inbox[:answer_arrived(sock, inbox, streams)]


def answer_arrived(sock: socket.socket, inbox: bytearray, streams: Streams) -> int:
    """Answer every whole call in `inbox`, in order, the replies in as few writes as
    REPLY_HOLD_S allows; returns the bytes consumed."""
    at, replies, held_since = 0, [], 0.0
    while len(inbox) - at >= wire.CALL.size:
        call_id, stream_id, op, size = wire.CALL.unpack_from(inbox, at)
        end = at + wire.CALL.size + size
        if len(inbox) < end:
            break
        answer = streams.handle(stream_id, op, bytes(inbox[at + wire.CALL.size:end]))
        at = end
        if answer is None:
            continue
        status, payload = answer
        replies += [wire.REPLY.pack(call_id, status, len(payload)), payload]
        now = time.monotonic()
        held_since = held_since or now
        if now - held_since >= REPLY_HOLD_S:
            sock.sendall(b"".join(replies))
            replies, held_since = [], 0.0
    if replies:
        sock.sendall(b"".join(replies))
    return at


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
            dropped = self._pipelines.pop(stream_id, None)
            if dropped is not None:
                _abandon_quietly(dropped)  # the codec's native memory, now (not when collected)
            self._failed.pop(stream_id, None)
            return None
        if stream_id in self._failed:
            return wire.FAILED, self._failed.pop(stream_id).encode()
        pipeline = self._pipelines.get(stream_id)
        if pipeline is None or op not in (wire.PUSH, wire.CLOSE):
            return wire.FAILED, f"no open stream {stream_id} for op {op}".encode()
        last = op == wire.CLOSE
        try:
            samples = np.frombuffer(payload, dtype=wire.samples_dtype(pipeline.spec))
            data = (pipeline.convert(samples, last) if pipeline.spec.float_stages
                    else pipeline.encode(samples, last))
            if last:
                data = wire.close_reply(data, pipeline.patches())
        except Exception as error:  # noqa: BLE001: this response fails; the others go on
            self._pipelines.pop(stream_id, None)
            _abandon_quietly(pipeline)
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


def _abandon_quietly(pipeline: EncodePipeline) -> None:
    """Free a pipeline nobody will close. A codec that fails even to close (it failed a call
    already, or was never fed) is left to the collector: the process serves the others on."""
    try:
        pipeline.abandon()
    except Exception:  # noqa: BLE001,S110: nobody waits on this stream any more
        pass


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


if __name__ == "__main__":
    sys.exit(main())
