"""What `/metrics` and `/health` read of a running engine: one flat snapshot of the scheduler's,
the KV cache's, Stage 0's, the codec's and the watermark stage's counters.

Its keys are the gauge and counter names of metrics.py; a key "<family>:<label>" is one sample of
a labelled counter (metrics.LABELLED_COUNTERS). The caller holds the engine's lock, so the
scheduler's numbers are one consistent snapshot; the stages' counters are plain totals that the
stages' own threads only ever increase.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from higgs_serve.codec.codec_runner import CodecRunner
    from higgs_serve.engine.mark_stage import MarkStage
    from higgs_serve.engine.output_processor import OutputProcessor
    from higgs_serve.engine.scheduler import Scheduler
    from higgs_serve.worker.model_runner import ModelRunner


def engine_stats(scheduler: Scheduler, outputs: OutputProcessor, runner: ModelRunner, codec_runner: CodecRunner,
                 marks: MarkStage | None) -> dict[str, float]:
    codec = codec_runner.counters
    return {
        "num_running": scheduler.num_running,
        "num_waiting": scheduler.num_waiting,
        "num_active": len(outputs),
        "free_kv_blocks": scheduler.kv.num_free_blocks,
        "total_kv_blocks": scheduler.kv.num_blocks,
        # the deadline policy's stream limit, what its timings predict, and the leads that steer it
        # (engine/deadlines/stream_limit.py)
        **scheduler.policy.limit_stats(scheduler.running),
        "codec_calls": codec.calls,
        "codec_windows": codec.windows,
        "codec_graph_calls": codec.graph_calls,
        "codec_busy_seconds": codec.busy_s,
        "prefix_cache_queries": scheduler.kv.prefix_cache_queries,
        "prefix_cache_hits": scheduler.kv.prefix_cache_hits,
        **{f"stage0_steps:{mode.value.lower()}": n for mode, n in runner.step_modes.items()},
        **{f"eager_steps:{outcome}": n for outcome, n in runner.eager_steps.items()},
        **_mark_stats(marks),
    }


def _mark_stats(marks: MarkStage | None) -> dict[str, float]:
    if marks is None:
        return {}
    c = marks.counters
    return {"watermark_calls": c.calls, "watermark_chunks": c.chunks, "watermark_audio_seconds": c.audio_s,
            "watermark_busy_seconds": c.busy_s}
