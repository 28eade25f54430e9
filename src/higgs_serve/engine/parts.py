"""What the engine loop (engine/core.py) is made of and reports: the built parts it drives, the
callbacks it calls on its own thread, and its counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ContextManager

from higgs_serve.engine.input_processor import InputProcessor
from higgs_serve.engine.output_processor import OutputProcessor
from higgs_serve.engine.scheduler import Scheduler

if TYPE_CHECKING:  # the device-side parts, for their types only: the loop imports no tensor library
    from higgs_serve.codec.codec_runner import CodecRunner
    from higgs_serve.engine.mark_stage import MarkStage
    from higgs_serve.worker.model_runner import ModelRunner


@dataclass(frozen=True)
class EngineParts:
    """The built components the loop drives (engine/builder.py: `build_engine_parts`)."""

    scheduler: Scheduler
    runner: ModelRunner  # Stage 0: launch(plan) -> pending, collect(pending) -> StepResult
    codec: CodecRunner  # Stage 1: started and stopped with the loop
    inputs: InputProcessor
    outputs: OutputProcessor
    # the watermark stage (its own thread, after the codec), when the deploy config marks audio;
    # `outputs` routes every sink through it
    marks: MarkStage | None = None


@dataclass(frozen=True)
class EngineHooks:
    """Callbacks the loop calls on its own thread; each optional, none on the hot path when unset.

    on_step(step_seconds, num_seqs, num_rows): after each step's rows were handed out (metrics).
        step_seconds runs from the previous step's rows (or the end of an idle spell) to these.
    profile(phase) -> context manager: entered around each phase of the loop, for profilers and
        timers. Phases: "step" (one whole `EngineCore.step` call) and, inside it, "schedule"
        (the scheduler's plan), "launch" (Stage 0 enqueues the plan), "collect" (waiting for the
        previous step's rows), "update" (the scheduler takes them) and "outputs" (rows → codec
        windows). The same object may be entered again for the next phase before it exits the
        enclosing "step", so return a fresh context manager per call.
    """

    on_step: Callable[[float, int, int], None] | None = None
    profile: Callable[[str], ContextManager] | None = None


@dataclass
class EngineCounters:
    steps: int = 0
    step_time_s: float = 0.0  # of the last step
    frames_generated: int = 0
