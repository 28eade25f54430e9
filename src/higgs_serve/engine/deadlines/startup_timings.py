"""What the engine times at start-up for the deadline policy (docs/architecture.md#admission-a-measured-limit):
plain numbers, measured by the builder (engine/builder.py `time_for_deadlines`) after warm-up and
graph capture, before the first request. They seed the step-time model (step_model.py) and
Stage 1's cost (stage1_load.py) in place of the prior, and so the stream limit's start
(stream_limit.py): the capacity is read off measurements, never off a guess, and nothing is
extrapolated past the largest size timed (the largest decode batch is `max_num_seqs`, the largest
window batch Stage 1's cap)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StartupTimings:
    # a decode step of n sequences (µs), for each size timed: the graph capture sizes up to
    # max_num_seqs, and max_num_seqs itself
    decode_us: Mapping[int, int]
    # one prompt token more in a step (µs): a prefill chunk's time less a decode step's, per token
    token_us: int
    # per Stage 1 thread (the codec's, then the mark stage's when on): a call of b steady-state
    # windows -> the thread's busy time per second of the audio they carry (millionths)
    stage1_ppm: tuple[Mapping[int, int], ...] = field(default=())

    def summary(self) -> str:
        """One log line: the sizes timed and a few of their values."""
        sizes = sorted(self.decode_us)
        shown = sorted({*sizes[:: max(1, len(sizes) // 6)], sizes[-1]})
        steps = ", ".join(f"{n}: {self.decode_us[n] / 1000:.1f}" for n in shown)
        stage1 = "; ".join(", ".join(f"x{b}: {ppm / 1e4:.1f} %" for b, ppm in sorted(curve.items()))
                           for curve in self.stage1_ppm)
        return f"decode step ms by batch {{{steps}}}, {self.token_us} µs a prompt token; Stage 1 busy per audio s: {stage1 or '-'}"
