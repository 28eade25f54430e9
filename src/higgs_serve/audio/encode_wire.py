"""The messages between the server and its encoder processes (audio/encode_worker.py,
server/last_mile/encode_pool.py), over one Unix stream socket per process.

A call is a fixed header and a payload; audio travels as raw little-endian samples and encoded
audio as raw bytes, so a chunk costs the server one header, no pickling, and the calls made in
one turn of the server's event loop (several streams' chunks, after an engine step) go out in
one socket write:

    call:  CALL header (call_id u32, stream_id u32, op u8, payload bytes u64), payload
    reply: REPLY header (call_id u32, status u8, payload bytes u64), payload

    OPEN   payload: the stream's EncodeSpec (audio/encode_pipeline.py) as JSON. No reply: an error opening it is the answer
           to the stream's next call, so the first chunk's OPEN and PUSH go out in one write.
    PUSH   payload: [n] samples at the model's rate, `samples_dtype(spec)`: int16
           (float_to_int16 of the chunk, made by the server) for a stream without float stages
           (speed 1 at the model's rate: the same bytes, half the payload), float32 otherwise
           (the time stretch and the resampler work on floats). Reply: the bytes ready so far.
    CLOSE  payload: the last audio (maybe none). Reply: close_reply(tail, patches).
    DROP   no payload, no reply: forget a stream that will not be closed (its response ended).

The process speaks first: one reply with call_id READY_CALL_ID once it has passed its start-up
check (status OK, payload JSON describing it) or failed it (status FAILED, the reason).
Calls are answered in the order they arrive, replies to calls that arrived together in one
write (audio/encode_worker.py).
"""

from __future__ import annotations

import struct

from higgs_serve.audio.encode_pipeline import EncodeSpec
from higgs_serve.audio.encoders.base import Patch

CALL = struct.Struct("<IIBQ")
REPLY = struct.Struct("<IBQ")
OPEN, PUSH, CLOSE, DROP = 1, 2, 3, 4
OK, FAILED = 0, 1
READY_CALL_ID = 0  # the process's unsolicited first reply; calls are numbered from 1
FLOAT_DTYPE, INT16_DTYPE = "<f4", "<i2"  # the audio of PUSH and CLOSE (samples_dtype)
_PATCH = struct.Struct("<QI")  # a patch's offset and size
_COUNT = struct.Struct("<I")


def samples_dtype(spec: EncodeSpec) -> str:
    """The dtype of a stream's PUSH and CLOSE audio: int16 unless its pipeline needs floats."""
    return FLOAT_DTYPE if spec.float_stages else INT16_DTYPE


def close_reply(tail: bytes, patches: list[Patch]) -> bytes:
    """CLOSE's reply payload: the patch count, each patch (offset, size, bytes), then the tail."""
    parts = [_COUNT.pack(len(patches))]
    for offset, value in patches:
        parts += [_PATCH.pack(offset, len(value)), value]
    return b"".join([*parts, tail])


def read_close_reply(payload: bytes) -> tuple[bytes, list[Patch]]:
    (count,), at = _COUNT.unpack_from(payload), _COUNT.size
    patches = []
    for _ in range(count):
        offset, size = _PATCH.unpack_from(payload, at)
        at += _PATCH.size
        patches.append((offset, bytes(payload[at:at + size])))
        at += size
    return bytes(payload[at:]), patches
