"""Time to first audio with the watermark on against off, side by side in one run.

Two engines over one loaded model, the deploy profile's `watermark` on in one and off in the
other, everything else the same. Requests alternate between them (on, off, on, off, ...), one
at a time, so both see the same machine: each streams `--frames` frames (a fixed length: min =
max new tokens) with its own seed. Per request: TTFA (from submit to the first non-empty chunk at
the sink: after the mark stage when on, straight from the codec when off), the whole request's
wall time, and the process CPU seconds (all threads, /proc via time.process_time) per audio
second. The mark must add at most 10 ms to TTFA (issue 43); the CPU difference is what marking
costs in place.

  python3 benchmarks/last_mile/bench_watermark_ttfa.py --device cpu --requests 40 --out benchmarks/results/watermark_ttfa_cpu.json

On a GPU machine, the real geometry (the mark then runs on the codec's GPU; two engines share
the GPU, so each takes less than half of its memory):

  python3 benchmarks/last_mile/bench_watermark_ttfa.py --device cuda --model /tmp/h4b --load-format dummy \
      --stage-overrides '{"0": {"gpu_memory_utilization": 0.4}}' --out benchmarks/results/watermark_ttfa_h200.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import now_iso, percentile, provenance, write_json  # noqa: E402

from higgs_serve.config.loader import load_for_command_line  # noqa: E402
from higgs_serve.engine.async_engine import SyncEngine  # noqa: E402
from higgs_serve.engine.builder import RuntimeOptions, load_model  # noqa: E402
from higgs_serve.engine.speech import SpeechRequest  # noqa: E402
from higgs_serve.model.hf_config import load_model_spec  # noqa: E402
from higgs_serve.model.tiny import write_tiny_model  # noqa: E402
from higgs_serve.sampling_params import SamplingParams  # noqa: E402

TEXT = "The morning train to the coast was late again, so we waited on the cold platform."


def one_request(engine: SyncEngine, request: SpeechRequest) -> dict:
    first: list[float] = []

    def on_chunk(_rid: str, chunk) -> None:
        if chunk.audio.size and not first:
            first.append(time.perf_counter())

    cpu0, t0 = time.process_time(), time.perf_counter()
    (result,) = engine.generate_batch([request], on_chunk=on_chunk)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    audio_s = result.audio.size / 24_000
    return {"ttfa_ms": (first[0] - t0) * 1e3, "wall_s": wall, "audio_s": audio_s, "cpu_s_per_audio_s": cpu / audio_s}


def summary(rows: list[dict]) -> dict:
    ttfa = [r["ttfa_ms"] for r in rows]
    return {"requests": len(rows), "ttfa_ms_p50": statistics.median(ttfa), "ttfa_ms_mean": statistics.fmean(ttfa),
            "ttfa_ms_p90": percentile(ttfa, 90), "ttfa_ms_min": min(ttfa),
            "wall_s_p50": statistics.median(r["wall_s"] for r in rows),
            "cpu_s_per_audio_s_p50": statistics.median(r["cpu_s_per_audio_s"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model dir (default: a tiny random checkpoint made in a temp dir)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--deploy-config", default=None, help="deploy profile (default: the model's)")
    p.add_argument("--stage-overrides", default=None, help="--stage-overrides JSON for both engines (default: none)")
    p.add_argument("--requests", type=int, default=40, help="measured requests per engine")
    p.add_argument("--warmup", type=int, default=3, help="untimed requests per engine first")
    p.add_argument("--frames", type=int, default=75, help="frames per request (25 = 1 s)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    started = now_iso()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = str(Path(scratch) / "tiny")
            write_tiny_model(Path(model), seed=0, preset="tiny", config_only=False)
        options = RuntimeOptions(load_format=args.load_format, device=args.device)
        model_type = load_model_spec(Path(model)).model_type
        deploys = {name: load_for_command_line(args.deploy_config, model_type, stage_overrides=args.stage_overrides,
                                               force_cpu=args.device == "cpu", watermark=name == "on")
                   for name in ("on", "off")}
        loaded = load_model(model, options, deploys["on"])
        engines = {name: SyncEngine(loaded, deploy, options) for name, deploy in deploys.items()}
        rows: dict[str, list[dict]] = {"on": [], "off": []}
        try:
            for i in range(args.warmup + args.requests):
                for name, engine in engines.items():
                    sampling = SamplingParams.from_defaults(deploys[name].stage0.default_sampling_params, seed=i,
                                                            max_new_tokens=args.frames, min_new_tokens=args.frames)
                    row = one_request(engine, SpeechRequest(f"{name}-{i}", TEXT, sampling, stream=True))
                    if i >= args.warmup:
                        rows[name].append(row)
        finally:
            for engine in engines.values():
                engine.close()
    result = {**provenance("bench_watermark_ttfa", started), "loadavg_end": os.getloadavg(),
              "model": args.model or "tiny (random, made by the benchmark)", "device_arg": args.device,
              "frames": args.frames, "on": summary(rows["on"]), "off": summary(rows["off"]),
              "rows": rows}
    result["ttfa_ms_p50_difference"] = result["on"]["ttfa_ms_p50"] - result["off"]["ttfa_ms_p50"]
    result["ttfa_ms_mean_difference"] = result["on"]["ttfa_ms_mean"] - result["off"]["ttfa_ms_mean"]
    result["cpu_s_per_audio_s_difference"] = (result["on"]["cpu_s_per_audio_s_p50"]
                                              - result["off"]["cpu_s_per_audio_s_p50"])
    if args.out:
        write_json(args.out, result)
    print({k: result[k] for k in ("on", "off", "ttfa_ms_p50_difference", "ttfa_ms_mean_difference",
                                  "cpu_s_per_audio_s_difference")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
