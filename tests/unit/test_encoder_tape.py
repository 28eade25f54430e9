"""A response's encoder tape (server/last_mile/encoder_tape.py): what it sent comes back in
order, in pieces of any size, in its own dtype; past 1 MiB it is on disk, not the heap."""

from __future__ import annotations

import numpy as np

from higgs_serve.server.last_mile.encoder_tape import TAPE_MEMORY_BYTES, EncoderTape


def test_a_tape_replays_what_was_recorded_in_pieces():
    rng = np.random.default_rng(0)
    for dtype in (np.int16, np.float32):
        chunks = [rng.integers(-30000, 30000, n).astype(dtype) for n in (960, 1920, 7, 24000, 0, 3)]
        tape = EncoderTape(dtype)
        for chunk in chunks:
            tape.record(chunk)
        whole = np.concatenate(chunks)
        assert tape.samples == whole.size
        for piece_samples in (1000, whole.size, 10 * whole.size):
            pieces = list(tape.pieces(piece_samples))
            assert all(p.dtype == dtype for p in pieces) and all(p.size == piece_samples for p in pieces[:-1])
            assert np.array_equal(np.concatenate(pieces), whole)
        tape.record(chunks[0])  # recording goes on after a replay
        assert np.array_equal(np.concatenate(list(tape.pieces(5000))), np.concatenate([whole, chunks[0]]))
        tape.close()


def test_a_long_tape_is_on_disk():
    tape = EncoderTape(np.int16)
    tape.record(np.zeros(TAPE_MEMORY_BYTES, np.int16))  # 2 MiB
    assert tape._file._rolled
    tape.close()
