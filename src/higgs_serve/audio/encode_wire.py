"""The messages between the server and its encoder processes (audio/encode_worker.py,
server/last_mile/encode_pool.py), over one Unix stream socket per process.

A call is a fixed header and a payload; audio travels as raw little-endian float32 samples and
encoded audio as raw bytes, so a chunk costs the server one header and one socket write, no
pickling:

    call:  CALL header (call_id u32, stream_id u32, op u8, payload bytes u64), payload
    reply: REPLY header (call_id u32, status u8, payload bytes u64), payload

    OPEN   payload: the stream's EncodeSpec (audio/encode_pipeline.py) as JSON. No reply: an error opening it is the answer
           to the stream's next call, so the first chunk's OPEN and PUSH go out in one write.
    PUSH   payload: [n] float32 at the model's rate. Reply: the bytes ready so far.
    CLOSE  payload: the last audio (maybe none). Reply: close_reply(tail, patches).
    DROP   no payload, no reply: forget a stream that will not be closed (its response ended).

The process speaks first: one reply with call_id READY_CALL_ID once it has passed its start-up
check (status OK, payload JSON describing it) or failed it (status FAILED, the reason).
Calls are answered in the order they arrive.
"""

from __future__ import annotations

import struct

from higgs_serve.audio.encoders.base import Patch

CALL = struct.Struct("<IIBQ")
REPLY = struct.Struct("<IBQ")
OPEN, PUSH, CLOSE, DROP = 1, 2, 3, 4
OK, FAILED = 0, 1
READY_CALL_ID = 0  # the process's unsolicited first reply; calls are numbered from 1
SAMPLE_DTYPE = "<f4"  # the audio of PUSH and CLOSE
_PATCH = struct.Struct("<QI")  # a patch's offset and size
_COUNT = struct.Struct("<I")


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
