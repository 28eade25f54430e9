"""The seam at long-form segment joins (engine/long_form.py, "Joins"): the same segments with
the same seed, joined plainly (ramp 0) and with the seam ramp, so the two recordings differ only
at the joins. Per run: the sample step |a[j] - a[j-1]| at each join against the step
distribution inside segments, the second difference (click energy) likewise, and the level jump
(RMS of the 5 ms before vs after) at joins against the same jump at points inside segments.

Runs the real engine in-process (no HTTP) through `LongFormSession`, so segment k is cloned from
segment k-1 as in serving.

  PYTHONPATH=src python3 benchmarks/codec/bench_seam.py --model /tmp/h4b --load-format dummy \\
      --segments 20 --frames 100 --out seam.json
  PYTHONPATH=src python3 benchmarks/codec/bench_seam.py --model /tmp/tiny --device cpu --frames 10
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import command_line, device_description, git_commit, markdown_table, now_iso, write_json  # noqa: E402

from higgs_serve.cli import deploy_from_args  # noqa: E402
from higgs_serve.engine.async_engine import AsyncEngine  # noqa: E402
from higgs_serve.engine.builder import RuntimeOptions  # noqa: E402
from higgs_serve.engine.long_form import SEAM_RAMP_SAMPLES, LongFormSession, SegmentAudio, SegmentDone  # noqa: E402
from higgs_serve.engine.speech import SpeechRequest  # noqa: E402
from higgs_serve.sampling_params import SamplingParams  # noqa: E402
from higgs_serve.text import group_segments  # noqa: E402

RATE = 24000
WINDOW = 120  # 5 ms: the level window either side of a point


def article(num_sentences: int) -> str:
    return " ".join(f"This is sentence number {i + 1} of the article, read in one voice."
                    for i in range(num_sentences))


async def record(engine: AsyncEngine, text: str, args, ramp_samples: int):
    sampling = SamplingParams(seed=args.seed, max_new_tokens=args.frames,
                              min_new_tokens=args.frames)
    base = SpeechRequest("seam", text, sampling, stream=True)
    session = LongFormSession(engine.generate, base, 10**12, ramp_samples=ramp_samples)
    pieces, joins = [], []
    for segment in group_segments(text, args.segment_chars):
        async for event in session.speak(segment):
            if isinstance(event, SegmentAudio):
                pieces.append(event.audio)
            elif isinstance(event, SegmentDone) and event.start_sample > 0:
                joins.append(event.start_sample)
    return np.concatenate(pieces), np.array(joins)


def _level_jump(audio: np.ndarray, points: np.ndarray) -> np.ndarray:
    before = np.array([np.sqrt(np.mean(audio[p - WINDOW:p] ** 2)) for p in points])
    after = np.array([np.sqrt(np.mean(audio[p:p + WINDOW] ** 2)) for p in points])
    return np.abs(after - before)


def seam_stats(audio: np.ndarray, joins: np.ndarray, rng: np.random.Generator) -> dict:
    step = np.abs(np.diff(audio))  # step[i] = |a[i+1] - a[i]|
    second = np.abs(np.diff(audio, 2))  # second[i] centred on a[i+1]
    inside = np.ones(step.size, bool)
    for j in joins:
        inside[max(0, j - WINDOW):j + WINDOW] = False
    probes = rng.choice(np.nonzero(inside[WINDOW:-WINDOW])[0] + WINDOW, size=200)
    return {
        "join_step_max": float(step[joins - 1].max()),
        "join_step_mean": float(step[joins - 1].mean()),
        "inside_step_p50": float(np.percentile(step[inside], 50)),
        "inside_step_p99": float(np.percentile(step[inside], 99)),
        "inside_step_max": float(step[inside].max()),
        "join_second_diff_max": float(second[joins - 1].max()),
        "inside_second_diff_p99": float(np.percentile(second[inside[:-1]], 99)),
        "join_level_jump_mean": float(_level_jump(audio, joins).mean()),
        "inside_level_jump_mean": float(_level_jump(audio, probes).mean()),
        "rms": float(np.sqrt(np.mean(audio ** 2))),
    }


async def main_async(args) -> dict:
    deploy = deploy_from_args(argparse.Namespace(
        deploy_config=args.deploy_config, stage_overrides=None, device=args.device), Path(args.model))
    engine = AsyncEngine(args.model, deploy, RuntimeOptions(load_format=args.load_format,
                                                            device=args.device))
    await engine.start()
    try:
        text = article(args.segments)
        rows, rng = [], np.random.default_rng(0)
        for ramp in (0, SEAM_RAMP_SAMPLES):
            audio, joins = await record(engine, text, args, ramp)
            rows.append({"ramp_ms": 1e3 * ramp / RATE, "joins": len(joins),
                         "audio_s": len(audio) / RATE, **seam_stats(audio, joins, rng)})
    finally:
        await engine.shutdown()
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    parser.add_argument("--device", default=None)
    parser.add_argument("--deploy-config", default=None)
    parser.add_argument("--segments", type=int, default=20, help="sentences (one segment each)")
    parser.add_argument("--segment-chars", type=int, default=80)
    parser.add_argument("--frames", type=int, default=100, help="frames per segment (min = max)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print(markdown_table(result["rows"], [
        ("ramp_ms", "ramp ms"), ("joins", "joins"), ("join_step_max", "join step max"),
        ("inside_step_p99", "inside step p99"), ("inside_step_max", "inside step max"),
        ("join_second_diff_max", "join 2nd diff max"), ("inside_second_diff_p99", "inside 2nd diff p99"),
        ("join_level_jump_mean", "join level jump"), ("inside_level_jump_mean", "inside level jump")]))
    if args.out:
        write_json(args.out, {"bench": "seam", "when": now_iso(), "commit": git_commit(),
                              "command": command_line(), "device": device_description(),
                              **vars(args), **result})


if __name__ == "__main__":
    main()
