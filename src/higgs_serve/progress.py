"""Progress for long phases (weight loading, warm-up, synthesis): a tqdm bar on a terminal, plain
log lines otherwise.

Producers take an `on_progress(done, total, label)` callback (`ProgressCallback`) and know
nothing about terminals; the CLI builds one `ProgressReporter` and hands it down. A label is
one phase: a new label starts a new bar (or a new run of log lines).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

ProgressCallback = Callable[[int, int, str], None]

logger = logging.getLogger("higgs_serve.progress")

# Without a terminal: a line at the end of a phase, and in between at every tenth of the way (at
# most one a MIN_GAP_S) or every HEARTBEAT_S, so a log shows a long phase is alive without
# flooding it with a fast one.
MIN_GAP_S = 1.0
HEARTBEAT_S = 5.0
_STEPS = 10


class ProgressReporter:
    """Callable as `(done, total, label, detail="")`; `detail` is shown beside the count
    (e.g. audio seconds and real-time factor during synthesis)."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None, unit: str = "it"):
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._unit = unit
        self._label: str | None = None
        self._bar = None  # tqdm on a terminal
        self._started = 0.0
        self._last_line = 0.0
        self._last_step = -1

    def __call__(self, done: int, total: int, label: str, detail: str = "") -> None:
        if label != self._label:
            self.close()
            self._open(label, total)
        if self._bar is not None:
            self._update_bar(done, total, detail)
        else:
            self._maybe_log(done, total, label, detail)
        if total and done >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar = None
        self._label = None

    def _open(self, label: str, total: int) -> None:
        self._label = label
        self._started = time.monotonic()
        self._last_line = self._started
        self._last_step = -1
        if self._tty:
            from tqdm import tqdm  # imported only on a terminal

            self._bar = tqdm(total=total or None, desc=label, unit=self._unit, file=self._stream,
                             dynamic_ncols=True, leave=True)

    def _update_bar(self, done: int, total: int, detail: str) -> None:
        bar = self._bar
        if total and bar.total != total:
            bar.total = total
        if detail:
            bar.set_postfix_str(detail, refresh=False)
        bar.update(done - bar.n)  # redraws at most every tqdm's mininterval (0.1 s)

    def _maybe_log(self, done: int, total: int, label: str, detail: str) -> None:
        now = time.monotonic()
        step = done * _STEPS // total if total else 0
        finished = bool(total) and done >= total
        quiet_for = now - self._last_line
        if not finished and (quiet_for < MIN_GAP_S or (step == self._last_step and quiet_for < HEARTBEAT_S)):
            return
        self._last_step, self._last_line = step, now
        count = f"{done}/{total}" if total else str(done)
        percent = f" ({100 * done // total}%)" if total else ""
        extra = f", {detail}" if detail else ""
        logger.info("%s: %s%s%s, %.1f s", label, count, percent, extra, now - self._started)
