"""What a server running in this process logs, caught from the loggers that do not propagate to
the root logger (uvicorn's) as well as ours: tests assert that normal events log no traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "higgs_serve")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def server_log() -> Iterator[list[logging.LogRecord]]:
    """The records logged while the block runs (a list, filled as they come)."""
    handler = _Collect()
    loggers = [logging.getLogger(name) for name in LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def faults(records: list[logging.LogRecord]) -> list[str]:
    """Records carrying a traceback, or logged at ERROR and above (each once)."""
    seen = {id(r): r for r in records if r.exc_info or r.levelno >= logging.ERROR}
    return [f"{r.name}: {r.getMessage()}" for r in seen.values()]
