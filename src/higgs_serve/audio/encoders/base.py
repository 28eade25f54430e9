"""The incremental-encoder interface (see the package docstring)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

Patch = tuple[int, bytes]  # (byte offset in the output, the bytes that belong there)


class StreamEncoder(ABC):
    # True where encoding costs real CPU (a codec): the server runs it off the event loop
    cpu_heavy: bool = False

    @abstractmethod
    def push(self, samples: np.ndarray) -> bytes:
        """samples: [n] int16 (n may be 0) -> the bytes the format has for them so far."""

    @abstractmethod
    def close(self) -> bytes:
        """Flush: the bytes still held. The encoder takes no more samples."""

    def patches(self) -> list[Patch]:
        """After close: bytes already returned that a file should overwrite (its header)."""
        return []

    def abandon(self) -> None:
        """The response ended without a close: free what the codec holds now (no bytes are
        made). Idempotent; nothing to free for an encoder that holds only Python objects."""
