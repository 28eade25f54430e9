"""The watermark measured: detection after common transformations, false positives,
transparency, and cost per audio second and per chunk (docs/model.md#watermark).

Sections (`--sections`, all by default):
- quality: `--clips` eSpeak NG speech clips of 2-20 s (benchmarks/speech_clips.py, the same every
  run). Each is marked whole (`embed`), chunk by chunk on the real streaming schedule (the
  default profile's window rule: 1, 1, 2, 4, 8, 16, then 25 frames) and on the file schedule
  (25-frame chunks, what `stream: false` requests get). Detection (score >= 0.5) is counted on
  the whole-marked clip unchanged and after each transformation (FFmpeg's encoders: mp3 64 kbit/s,
  opus 32 kbit/s, aac 64 kbit/s; G.711 mu-law at 8 kHz; soxr to 16 kHz; white noise at 20 dB
  SNR; 1 s cut from each end), on the chunk-wise marked clips, and on the unmarked clips under
  the same transformations (false positives). Rates are split at 5 s. Transparency: the mark's
  SNR and PESQ (ITU-T P.862 wide band, 16 kHz; the `pesq` package) of marked against unmarked.
- threshold: the decision threshold, chosen on clips the quality section never sees (another
  seed): every clip's score marked and unmarked under every transformation, and for candidate
  thresholds the false positives and the detection rates they give. audio/watermark.py's
  THRESHOLD is the one chosen from this table (docs/model.md#watermark says how).
- verdict: the user-facing answer (`detected` / `verdict`, audio/watermark_detect.py) on a
  negative set of over 1,000 clips (tones, pulsed tones, chords, sweeps, silence, white, pink and
  brown noise, noise bursts, synthetic melodies and drums, clipped audio, real human speech and
  real music and ambience not made here, unmarked espeak-ng speech) and on marked speech
  (espeak-ng and real recorded speech, unchanged, mp3 64 kbit/s, opus 32 kbit/s, mu-law 8 kHz),
  in a calibration and an evaluation split (benchmarks/last_mile/verdict_clips.py). Per clip: the
  score, the share of judged frames marked, the speech evidence and the verdict.
- cost: CPU seconds (process time: all threads) and wall seconds per call of one stream's chunk
  at each chunk size of the schedule (window = 220 ms context + chunk), per audio second for a
  whole stream on the streaming schedule, and per audio second for batches of B 1 s chunks
  (B = 1, 16, 64: the engine's mark stage batches across requests). On CUDA (`--device cuda`)
  the wall times are device-synchronised.
- batched: what one pass of the engine's mark stage costs: B streams (`--batch-sizes`, 1 to 256)
  each with one pending window drawn from a 10 s stream's windows on the streaming schedule
  (the ramp's 5- to 85-frame windows and the steady 123-frame ones, as a closed loop of 10 s
  streams holds them), timed three ways on the same windows: `graphs` one call replaying a CUDA
  graph (the watermark prepared for up to max(B) windows, as the builder does; CUDA only),
  `eager_one_call` the same padded batch without graphs, and `eager_per_length` one call per
  distinct window length (the stage's batches before issue 54, unpadded; the same code path, so
  it approximates the old calls' cost). `--smoke` runs it small.

  python3 benchmarks/last_mile/bench_watermark.py --device cpu --sections quality --out benchmarks/results/watermark_quality_cpu.json
  python3 benchmarks/last_mile/bench_watermark.py --device cpu --sections cost --threads 1 --out benchmarks/results/watermark_cost_cpu.json
  python3 benchmarks/last_mile/bench_watermark.py --device cpu --sections threshold --out benchmarks/results/watermark_threshold_cpu.json
  python3 benchmarks/last_mile/bench_watermark.py --device cuda --sections cost --out benchmarks/results/watermark_cost_h200.json
  python3 benchmarks/last_mile/bench_watermark.py --device cuda --sections batched --repeats 20 --out watermark_batched_h100.json
  python3 benchmarks/last_mile/bench_watermark.py --device cpu --sections batched --smoke   # a quick check anywhere
  python3 benchmarks/last_mile/bench_watermark.py --sections verdict --splits calibration --threads 1 --out benchmarks/results/watermark_negatives_calibration_cpu.json
  python3 benchmarks/last_mile/bench_watermark.py --sections verdict --splits evaluation --threads 1 --out benchmarks/results/watermark_negatives_evaluation_cpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # tests/support
from common import REPO_ROOT, mean, now_iso, percentile, provenance, write_json  # noqa: E402
from speech_clips import SAMPLE_RATE_HZ, make_clips  # noqa: E402
from support.decoders import av_decode, av_encode  # noqa: E402  (tests/support: FFmpeg's libraries)

from higgs_serve.audio.perth.rows import window_frames  # noqa: E402
from higgs_serve.audio.watermark import THRESHOLD, MarkStream, detect, embed, load_watermarker  # noqa: E402
from higgs_serve.codec.chunker import StreamChunker, WindowParams, file_window_params  # noqa: E402

FRAME_SAMPLES = 960
SHORT_S = 5.0  # the acceptance counts clips of at least this long


# ----------------------------------------------------------------------------- schedules
def chunk_schedule(num_frames: int, params: WindowParams) -> list[int]:
    """New frames per chunk the engine's window rule gives a request of num_frames frames."""
    chunker = StreamChunker(params)
    out = []
    for available in range(1, num_frames + 1):
        window = chunker.push(available, available == num_frames)
        if window is not None and window.new_frames:
            out.append(window.new_frames)
    return out


STREAM_PARAMS = WindowParams()  # the shipped profiles' streaming rule
FILE_PARAMS = file_window_params(WindowParams(), (25, 4))  # exact 25-frame chunks


def mark_chunkwise(wm, audio: np.ndarray, params: WindowParams) -> np.ndarray:
    """audio (a whole number of frames) marked the way the engine's mark stage marks a stream."""
    stream, pos, out = MarkStream(wm.context_samples), 0, []
    for frames in chunk_schedule(audio.size // FRAME_SAMPLES, params):
        chunk = audio[pos: pos + frames * FRAME_SAMPLES]
        pos += chunk.size
        out.append(stream.apply(chunk, wm.residuals([stream.window(chunk)])[0]))
    return np.concatenate(out)


# ----------------------------------------------------------------------------- transformations
def codec_roundtrip(audio: np.ndarray, codec: str, muxer: str, bit_rate: int | None = None,
                    rate_hz: int = SAMPLE_RATE_HZ) -> tuple[np.ndarray, int]:
    """Encode 24 kHz audio with FFmpeg's encoder `codec` in `muxer` at `rate_hz` (PyAV: the
    libraries, no `ffmpeg` program) and decode it back to float32 at `rate_hz`."""
    coded = av_encode(audio, SAMPLE_RATE_HZ, codec, muxer, out_rate_hz=rate_hz, bit_rate=bit_rate)
    as_format = {"ogg": "opus", "adts": "aac", "mulaw": "ulaw"}.get(muxer, muxer)  # headerless: named
    return av_decode(coded, as_format, rate_hz, sample_format="flt"), rate_hz


def add_noise(audio: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
    power = float(np.mean(audio.astype(np.float64) ** 2))
    noise = np.random.default_rng(seed).standard_normal(audio.size) * np.sqrt(power / 10 ** (snr_db / 10))
    return (audio + noise).astype(np.float32)


TRANSFORMS = {
    "unchanged": lambda a, i: (a, SAMPLE_RATE_HZ),
    "mp3_64k": lambda a, i: codec_roundtrip(a, "libmp3lame", "mp3", 64_000),
    "opus_32k": lambda a, i: codec_roundtrip(a, "libopus", "ogg", 32_000),
    "aac_64k": lambda a, i: codec_roundtrip(a, "aac", "adts", 64_000),
    "mulaw_8k": lambda a, i: codec_roundtrip(a, "pcm_mulaw", "mulaw", rate_hz=8000),
    "resample_16k": lambda a, i: (soxr.resample(a, SAMPLE_RATE_HZ, 16000).astype(np.float32), 16000),
    "noise_20db": lambda a, i: (add_noise(a, 20.0, seed=i), SAMPLE_RATE_HZ),
    "trim_1s_each_end": lambda a, i: (a[SAMPLE_RATE_HZ:-SAMPLE_RATE_HZ], SAMPLE_RATE_HZ),
}


# ----------------------------------------------------------------------------- quality
def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / np.sum((reference - other) ** 2.0)))


def pesq_wb(reference: np.ndarray, degraded: np.ndarray) -> float | None:
    from pesq import pesq

    ref16 = soxr.resample(reference, SAMPLE_RATE_HZ, 16000)
    deg16 = soxr.resample(degraded, SAMPLE_RATE_HZ, 16000)
    return float(pesq(16000, ref16, deg16, "wb"))


def rate_summary(scores: list[float], seconds: list[float]) -> dict:
    def part(keep):
        chosen = [s for s, d in zip(scores, seconds) if keep(d)]
        if not chosen:
            return {"clips": 0}
        return {"clips": len(chosen), "detected": sum(s >= THRESHOLD for s in chosen),
                "rate": sum(s >= THRESHOLD for s in chosen) / len(chosen),
                # at the cut resemble-perth's own wrapper uses (it rounds the score)
                "rate_at_0_5": sum(s >= 0.5 for s in chosen) / len(chosen),
                "score_min": min(chosen), "score_p1": percentile(chosen, 1), "score_p50": percentile(chosen, 50),
                "score_max": max(chosen)}
    return {"at_least_5s": part(lambda d: d >= SHORT_S), "under_5s": part(lambda d: d < SHORT_S),
            "all": part(lambda d: True)}


CANDIDATE_THRESHOLDS = (0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
CALIBRATION_SEED = 7  # the quality section's clips use speech_clips' default seed (43)


def threshold_table(wm, num_clips: int) -> dict:
    clips = make_clips(num_clips, seed=CALIBRATION_SEED)
    seconds = [c.seconds for c in clips]
    marked = {name: [] for name in TRANSFORMS}
    unmarked = {name: [] for name in TRANSFORMS}
    for clip in clips:
        audio = clip.audio[: clip.audio.size // FRAME_SAMPLES * FRAME_SAMPLES]
        whole = embed(wm, audio)
        for name, transform in TRANSFORMS.items():
            marked[name].append(detect(wm, *transform(whole, clip.index)).score)
            unmarked[name].append(detect(wm, *transform(audio, clip.index)).score)
        print(f"calibration clip {clip.index:3d} {clip.seconds:5.1f} s", flush=True)
    every_unmarked = [s for scores in unmarked.values() for s in scores]
    rows = []
    for t in CANDIDATE_THRESHOLDS:
        rows.append({"threshold": t, "false_positives": sum(s >= t for s in every_unmarked),
                     "unmarked_scores": len(every_unmarked),
                     "detection_at_least_5s": {name: sum(s >= t for s, d in zip(scores, seconds) if d >= SHORT_S)
                                               / sum(d >= SHORT_S for d in seconds) for name, scores in marked.items()},
                     "detection_under_5s": {name: sum(s >= t for s, d in zip(scores, seconds) if d < SHORT_S)
                                            / max(sum(d < SHORT_S for d in seconds), 1)
                                            for name, scores in marked.items()}})
    return {"clips": len(clips), "seed": CALIBRATION_SEED, "at_least_5s": sum(d >= SHORT_S for d in seconds),
            "unmarked_score_max": max(every_unmarked), "unmarked_score_p999": percentile(every_unmarked, 99.9),
            "unmarked_score_max_by_transform": {name: max(scores) for name, scores in unmarked.items()},
            "marked_score_min_by_transform": {name: min(scores) for name, scores in marked.items()},
            "candidates": rows}


def quality(wm, num_clips: int) -> dict:
    clips = make_clips(num_clips)
    seconds = [c.seconds for c in clips]
    marked_scores = {name: [] for name in TRANSFORMS}
    unmarked_scores = {name: [] for name in TRANSFORMS}
    chunkwise = {"stream_schedule": [], "file_schedule": []}
    snr = {"whole": [], "stream_schedule": []}
    pesq = {"whole": [], "stream_schedule": []}
    for clip in clips:
        # a whole number of frames, as the engine's audio always is
        audio = clip.audio[: clip.audio.size // FRAME_SAMPLES * FRAME_SAMPLES]
        whole = embed(wm, audio)
        streamed = mark_chunkwise(wm, audio, STREAM_PARAMS)
        for name, transform in TRANSFORMS.items():
            marked_scores[name].append(detect(wm, *transform(whole, clip.index)).score)
            unmarked_scores[name].append(detect(wm, *transform(audio, clip.index)).score)
        chunkwise["stream_schedule"].append(detect(wm, streamed, SAMPLE_RATE_HZ).score)
        chunkwise["file_schedule"].append(detect(wm, mark_chunkwise(wm, audio, FILE_PARAMS), SAMPLE_RATE_HZ).score)
        for name, marked in (("whole", whole), ("stream_schedule", streamed)):
            snr[name].append(snr_db(audio, marked))
            pesq[name].append(pesq_wb(audio, marked))
        print(f"clip {clip.index:3d} {clip.seconds:5.1f} s  whole {marked_scores['unchanged'][-1]:.3f} "
              f"stream {chunkwise['stream_schedule'][-1]:.3f} unmarked {unmarked_scores['unchanged'][-1]:.3f} "
              f"pesq {pesq['whole'][-1]:.2f}/{pesq['stream_schedule'][-1]:.2f}", flush=True)
    detection = {name: rate_summary(s, seconds) for name, s in marked_scores.items()}
    detection.update({f"chunkwise_{name}": rate_summary(s, seconds) for name, s in chunkwise.items()})
    false_positives = {}
    for name, scores in unmarked_scores.items():
        flagged = [s >= THRESHOLD for s in scores]
        false_positives[name] = {"clips": len(scores), "flagged": sum(flagged), "rate": sum(flagged) / len(scores),
                                 "flagged_at_0_5": sum(s >= 0.5 for s in scores),
                                 "score_max": max(scores), "score_p99": percentile(scores, 99)}
    return {
        "clips": {"count": len(clips), "seconds_min": min(seconds), "seconds_max": max(seconds),
                  "at_least_5s": sum(d >= SHORT_S for d in seconds), "voices": sorted({c.voice for c in clips})},
        "threshold": THRESHOLD,
        "stream_schedule_frames": chunk_schedule(500, STREAM_PARAMS),
        "file_schedule_frames": chunk_schedule(100, FILE_PARAMS),
        "detection": detection,
        "false_positives": false_positives,
        "per_clip": {"seconds": seconds, "marked": marked_scores, "unmarked": unmarked_scores, "chunkwise": chunkwise,
                     "snr_db": snr, "pesq_wb": pesq},
        "transparency": {
            name: {"snr_db_mean": mean(snr[name]), "snr_db_min": min(snr[name]),
                   "pesq_wb_mean": mean(pesq[name]), "pesq_wb_min": min(pesq[name]),
                   "pesq_wb_p50": percentile(pesq[name], 50)} for name in snr},
    }


# ----------------------------------------------------------------------------- cost
def _timed(fn, repeats: int, sync) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) per call, the median of `repeats` calls after one warm-up."""
    fn()
    sync()
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        sync()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return float(np.median(cpu)), float(np.median(wall))


def _round_robin(calls: dict, repeats: int, sync) -> dict:
    """name -> (median process CPU s, median wall s) of `repeats` calls each, the calls of all
    names interleaved round by round (a busy spell on a shared machine hits every name alike)."""
    cpu: dict = {name: [] for name in calls}
    wall: dict = {name: [] for name in calls}
    for fn in calls.values():
        fn()
    sync()
    for _ in range(repeats):
        for name, fn in calls.items():
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            sync()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    return {name: (float(np.median(cpu[name])), float(np.median(wall[name]))) for name in calls}


FIXTURE_SPEECH = REPO_ROOT / "tests" / "support" / "data" / "aligned_sentence.flac"


def twenty_seconds_of_speech() -> tuple[np.ndarray, str]:
    """20 s of eSpeak NG speech, and where it came from: made here when the `espeakng-loader`
    wheel is installed (the `bench` extra), else the committed eSpeak NG sentence repeated (the
    GPU host's wheel set leaves it out; the mark's cost does not depend on what is said)."""
    if importlib.util.find_spec("espeakng_loader") is not None:
        return make_clips(3, 20.0, 20.0)[0].audio, "eSpeak NG clip"
    import soundfile as sf

    sentence, rate_hz = sf.read(FIXTURE_SPEECH, dtype="float32")
    if rate_hz != SAMPLE_RATE_HZ:
        sentence = soxr.resample(sentence, rate_hz, SAMPLE_RATE_HZ).astype(np.float32)
    reps = -(-20 * SAMPLE_RATE_HZ // sentence.size)
    return np.tile(sentence, reps)[: 20 * SAMPLE_RATE_HZ], f"{FIXTURE_SPEECH.name} repeated"


def cost(wm, device: str, repeats: int) -> dict:
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rng = np.random.default_rng(0)
    speech, source = twenty_seconds_of_speech()
    # a stream's first chunk is marked alone (no audio before it); later ones with the context
    calls = {("first", 1): (lambda: wm.residuals([speech[:FRAME_SAMPLES]]))}
    for frames in (1, 2, 4, 8, 16, 25):
        window = np.concatenate([speech[-wm.context_samples:], speech[: frames * FRAME_SAMPLES]])
        calls[("with_context", frames)] = (lambda w=window: wm.residuals([w]))
    timed = _round_robin(calls, repeats, sync)
    per_chunk = [{"chunk_frames": frames, "chunk_ms": frames * 40, "window": kind,
                  "window_samples": (0 if kind == "first" else wm.context_samples) + frames * FRAME_SAMPLES,
                  "cpu_ms": cpu_s * 1e3, "wall_ms": wall_s * 1e3, "cpu_ms_per_audio_s": cpu_s * 1e3 / (frames * 0.04)}
                 for (kind, frames), (cpu_s, wall_s) in timed.items()]
    audio = speech[: speech.size // FRAME_SAMPLES * FRAME_SAMPLES]
    audio_s = audio.size / SAMPLE_RATE_HZ
    stream_cpu, stream_wall = _timed(lambda: mark_chunkwise(wm, audio, STREAM_PARAMS), max(repeats // 10, 3), sync)
    whole_cpu, whole_wall = _timed(lambda: embed(wm, audio), max(repeats // 10, 3), sync)
    detect_cpu, detect_wall = _timed(lambda: detect(wm, audio, SAMPLE_RATE_HZ), max(repeats // 10, 3), sync)
    batched = []
    for batch in (1, 16, 64):
        windows = [np.concatenate([rng.standard_normal(wm.context_samples).astype(np.float32) * 0.01,
                                   speech[i * 2400: i * 2400 + 25 * FRAME_SAMPLES]]) for i in range(batch)]
        cpu_s, wall_s = _timed(lambda: wm.residuals(windows), max(repeats // 10, 3), sync)
        batched.append({"batch_windows": batch, "chunk_frames": 25, "cpu_ms": cpu_s * 1e3, "wall_ms": wall_s * 1e3,
                        "cpu_ms_per_audio_s": cpu_s * 1e3 / batch, "wall_ms_per_audio_s": wall_s * 1e3 / batch})
    return {
        "device": device, "torch_threads": torch.get_num_threads(), "speech": source,
        "per_chunk_call": per_chunk,
        "stream_20s": {"audio_s": audio_s, "calls": len(chunk_schedule(audio.size // FRAME_SAMPLES, STREAM_PARAMS)),
                       "cpu_ms_per_audio_s": stream_cpu * 1e3 / audio_s, "wall_ms_per_audio_s": stream_wall * 1e3 / audio_s},
        "whole_20s": {"cpu_ms_per_audio_s": whole_cpu * 1e3 / audio_s, "wall_ms_per_audio_s": whole_wall * 1e3 / audio_s},
        "detect_20s": {"cpu_ms_per_audio_s": detect_cpu * 1e3 / audio_s, "wall_ms_per_audio_s": detect_wall * 1e3 / audio_s},
        "batched_1s_chunks": batched,
    }


# ----------------------------------------------------------------------------- batched
def window_mix(speech: np.ndarray, streams: int, context_samples: int, seed: int) -> list[np.ndarray]:
    """One pending window for each of `streams` streams, each at a random chunk of a 10 s
    stream on the streaming schedule (its window: the chunk with up to `context_samples` before)."""
    schedule = chunk_schedule(250, STREAM_PARAMS)  # 10 s: 1, 1, 2, 4, 8, 16, then 25-frame chunks
    starts = np.cumsum([0, *schedule[:-1]]) * FRAME_SAMPLES
    rng = np.random.default_rng(seed)
    windows = []
    for _ in range(streams):
        k = int(rng.integers(len(schedule)))
        offset = int(rng.integers(speech.size - 250 * FRAME_SAMPLES))  # where in the speech the stream is
        end = offset + starts[k] + schedule[k] * FRAME_SAMPLES
        windows.append(speech[max(offset + starts[k] - context_samples, offset): end])
    return windows


def batched(device: str, batch_sizes: list[int], repeats: int) -> dict:
    """One mark-stage pass of B streams' windows, three ways (module note)."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    eager = load_watermarker("perth", device)
    graphs = load_watermarker("perth", device) if device.startswith("cuda") else None
    capture = graphs.prepare(max(batch_sizes), 25 * FRAME_SAMPLES) if graphs is not None else None
    speech, source = twenty_seconds_of_speech()
    rows = []
    for batch in batch_sizes:
        windows = window_mix(speech, batch, eager.context_samples, seed=batch)
        by_length: dict[int, list[np.ndarray]] = {}
        for w in windows:
            by_length.setdefault(w.size, []).append(w)
        calls = {"eager_one_call": lambda w=windows: eager.residuals(w),
                 "eager_per_length": lambda g=list(by_length.values()): [eager.residuals(x) for x in g]}
        if graphs is not None:
            calls["graphs"] = lambda w=windows: graphs.residuals(w)
        timed = _round_robin(calls, repeats, sync)
        audio_s = sum(w.size for w in windows) / SAMPLE_RATE_HZ
        rows.append({"streams": batch, "distinct_lengths": len(by_length), "window_audio_s": audio_s,
                     "window_frames": sorted(window_frames(w.size) for w in windows),
                     **{f"{name}_wall_ms": wall_s * 1e3 for name, (_, wall_s) in timed.items()},
                     **{f"{name}_cpu_ms": cpu_s * 1e3 for name, (cpu_s, _) in timed.items()}})
        print(f"B={batch:3d} lengths={len(by_length):2d} " + " ".join(
            f"{name} {wall_s * 1e3:.2f} ms" for name, (_, wall_s) in timed.items()), flush=True)
    result = {"device": device, "torch_threads": torch.get_num_threads(), "speech": source, "batches": rows,
              "graph_capture": capture}
    if graphs is not None:  # every graphs call must have replayed a graph (none fell back to eager)
        result["graph_calls"], result["graph_eager_calls"] = graphs.runner.graph_calls, graphs.runner.eager_calls
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="torch device of the watermark (cpu, cuda, cuda:N)")
    p.add_argument("--sections", nargs="+", choices=["quality", "cost", "threshold", "batched", "verdict"],
                   default=["quality", "cost"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                   help="streams per mark-stage pass (batched)")
    p.add_argument("--smoke", action="store_true", help="batched: 1 and 3 streams, 2 repeats (a quick check)")
    p.add_argument("--splits", nargs="+", choices=["calibration", "evaluation"], default=["calibration", "evaluation"],
                   help="the verdict section's splits")
    p.add_argument("--clips", type=int, default=150, help="speech clips for the quality section")
    p.add_argument("--calibration-clips", type=int, default=100, help="speech clips for the threshold section")
    p.add_argument("--repeats", type=int, default=50, help="timed calls per chunk size (cost)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; the committed CPU cost uses 1: CPU time per "
                        "unit of work, not two threads spinning on a shared machine)")
    p.add_argument("--out", default=None, help="write the JSON here")
    args = p.parse_args(argv)
    started = now_iso()
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    wm = load_watermarker("perth", args.device)
    result = {**provenance("bench_watermark", started), "loadavg_start": os.getloadavg(), "watermark": wm.name}
    if "cost" in args.sections:
        result["cost"] = cost(wm, args.device, args.repeats)
    if "batched" in args.sections:
        sizes, repeats = ([1, 3], 2) if args.smoke else (args.batch_sizes, args.repeats)
        result["batched"] = batched(args.device, sizes, repeats)
    if "threshold" in args.sections:
        result["threshold"] = threshold_table(wm, args.calibration_clips)
    if "quality" in args.sections:
        result["quality"] = quality(wm, args.clips)
    if "verdict" in args.sections:
        from verdict_bench import verdict_section

        result["verdict"] = verdict_section(wm, args.splits)
    result["loadavg_end"] = os.getloadavg()
    result["finished_at"] = now_iso()
    if args.out:
        write_json(args.out, result)
    summary = {k: result[k] for k in ("cost", "batched") if k in result}
    if "threshold" in result:
        summary["threshold"] = {k: v for k, v in result["threshold"].items() if k != "candidates"}
        summary["threshold"]["candidates"] = [
            {"threshold": row["threshold"], "false_positives": row["false_positives"],
             "noise_20db_at_least_5s": row["detection_at_least_5s"]["noise_20db"],
             "worst_at_least_5s": min(row["detection_at_least_5s"].values())} for row in result["threshold"]["candidates"]]
    if "verdict" in result:
        summary["verdict"] = {split: {k: v for k, v in part.items() if k != "per_clip"}
                              for split, part in result["verdict"].items() if split != "sources"}
    if "quality" in result:
        q = result["quality"]
        summary["detection_>=5s"] = {k: v["at_least_5s"].get("rate") for k, v in q["detection"].items()}
        summary["detection_<5s"] = {k: v["under_5s"].get("rate") for k, v in q["detection"].items()}
        summary["false_positive_rate"] = {k: v["rate"] for k, v in q["false_positives"].items()}
        summary["transparency"] = q["transparency"]
    import json
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
