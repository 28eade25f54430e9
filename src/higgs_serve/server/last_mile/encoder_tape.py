"""What one response has sent its encoder process, kept while the response could still be
replayed on another process (server/last_mile/encode_pool.py, `EncoderStream`): a stream's until
its first bytes leave, a file's until it is finished (docs/operations.md#worker-processes).

The samples are kept as they went on the wire (int16, or float32 when the pipeline has float
stages: audio/encode_wire.py), in a spooled temporary file: in memory up to TAPE_MEMORY_BYTES,
then on disk (the system temp directory), so a long file's replay costs disk, not the heap: the
16-bit audio of the file's length at the model's rate (48 KB a second at 24 kHz), twice that in
float32.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import numpy as np

TAPE_MEMORY_BYTES = 1 << 20
REPLAY_PIECE_S = 10.0  # the audio of each call that replays a tape


class EncoderTape:
    def __init__(self, dtype: np.dtype):
        self.dtype = np.dtype(dtype)
        self._file = tempfile.SpooledTemporaryFile(max_size=TAPE_MEMORY_BYTES, prefix="higgs-serve-tape-")
        self.samples = 0

    def record(self, samples: np.ndarray) -> None:
        """samples: [n] in the tape's dtype, as they were sent."""
        self._file.write(np.ascontiguousarray(samples, dtype=self.dtype).data)
        self.samples += samples.size

    def pieces(self, piece_samples: int) -> Iterator[np.ndarray]:
        """Everything recorded, in order, piece_samples at a time (the last piece shorter)."""
        self._file.seek(0)
        try:
            while data := self._file.read(piece_samples * self.dtype.itemsize):
                yield np.frombuffer(data, dtype=self.dtype)
        finally:
            self._file.seek(0, 2)  # later records go after

    def close(self) -> None:
        self._file.close()
