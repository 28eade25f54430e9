"""bench_watermark.py's `verdict` section: the detector's answer, as the endpoint and
`higgs-serve detect` give it (audio/watermark_detect.py's LazyDetector), on the negative and
positive sets of verdict_clips.py, per split."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
from verdict_clips import (
    SPLITS,
    TRANSFORMS,
    Clip,
    asterisk_speech,
    espeak_speech,
    real_recordings,
    synthetic,
)

from higgs_serve.audio.watermark import THRESHOLD, embed
from higgs_serve.audio.watermark_detect import MIN_MARKED_FRAME_FRACTION, LazyDetector
from higgs_serve.audio import speech_evidence

SHORT_S = 5.0
# per split: made-here clips per kind, real speech clips, espeak-ng clips, marked clips of each source
SIZES = {"calibration": (25, 60, 30, 30), "evaluation": (55, 120, 60, 40)}


def negatives(split: str) -> tuple[list[Clip], list[str]]:
    index = SPLITS[split]
    made, real_speech, espeak, _ = SIZES[split]
    seed = 100 + index
    speech = asterisk_speech(index, 2.0, 12.0, real_speech, seed)
    clips = synthetic(made, seed, speech[:20] or espeak_speech(5, seed))
    clips += [Clip("speech_real", f"asterisk_{i}", a) for i, a in enumerate(speech)]
    clips += [Clip("speech_real_clipped", f"asterisk_clipped_{i}",
                   np.clip(a / max(np.abs(a).max(), 1e-6) * 10 ** (g / 20), -1, 1).astype(np.float32))
              for i, (a, g) in enumerate(zip(speech[::3], np.linspace(6, 30, len(speech[::3]))))]
    clips += [Clip("speech_espeak_unmarked", f"espeak_{i}", a) for i, a in enumerate(espeak_speech(espeak, seed, 12.0))]
    recordings, found = real_recordings(index, seed)
    clips += recordings
    clips += [Clip(f"{c.kind}_mp3", c.name, *TRANSFORMS["mp3_64k"](c.audio)) for c in recordings]
    return clips, found


def positives(split: str, wm) -> list[Clip]:
    index = SPLITS[split]
    _, _, _, marked = SIZES[split]
    seed = 200 + index
    sources = [("espeak", a) for a in espeak_speech(marked, seed, 12.0)]
    sources += [("speech_real", a) for a in asterisk_speech(index, 2.0, 12.0, marked, seed)]
    out = []
    for i, (source, audio) in enumerate(sources):
        audio = audio[: audio.size // 960 * 960]
        marked_audio = embed(wm, audio)
        for name, transform in TRANSFORMS.items():
            out.append(Clip(f"{source}/{name}", f"{source}_{i}", *transform(marked_audio)))
    return out


def judge(detector: LazyDetector, clips: list[Clip], what: str) -> list[dict]:
    rows = []
    for i, clip in enumerate(clips):
        if i % 100 == 0:
            print(f"  {what}: {i}/{len(clips)}", flush=True)
        found = detector.detect(clip.audio, clip.rate_hz)
        rows.append({"kind": clip.kind, "name": clip.name, "seconds": round(clip.seconds, 2),
                     "verdict": found.verdict, "score": round(found.score, 4),
                     "marked_frame_fraction": round(found.marked_frame_fraction, 3),
                     "evidence": found.evidence.to_json()})
    return rows


def negative_summary(rows: list[dict]) -> dict:
    by_kind: dict = {}
    for kind in sorted({r["kind"] for r in rows}):
        part = [r for r in rows if r["kind"] == kind]
        by_kind[kind] = {"clips": len(part), **Counter(r["verdict"] for r in part),
                         "score_max": max(r["score"] for r in part),
                         "score_max_speech_like": max([r["score"] for r in part if r["evidence"]["speech_like"]],
                                                      default=None)}
    return {"clips": len(rows), "false_positives": sum(r["verdict"] == "marked" for r in rows),
            "verdicts": dict(Counter(r["verdict"] for r in rows)),
            "score_at_least_0_4": sum(r["score"] >= 0.4 for r in rows), "by_kind": by_kind}


def positive_summary(rows: list[dict]) -> dict:
    out = {}
    for kind in sorted({r["kind"] for r in rows}):
        for label, keep in (("at_least_5s", lambda s: s >= SHORT_S), ("under_5s", lambda s: s < SHORT_S)):
            part = [r for r in rows if r["kind"] == kind and keep(r["seconds"])]
            if part:
                out.setdefault(kind, {})[label] = {
                    "clips": len(part), "detected": sum(r["verdict"] == "marked" for r in part),
                    "rate": sum(r["verdict"] == "marked" for r in part) / len(part),
                    **Counter(r["verdict"] for r in part), "score_min": min(r["score"] for r in part),
                    "marked_frame_fraction_min": min(r["marked_frame_fraction"] for r in part)}
    return out


def verdict_section(wm, splits: list[str]) -> dict:
    detector = LazyDetector()
    result: dict = {"rule": {"threshold": THRESHOLD,
                             "min_marked_frame_fraction": MIN_MARKED_FRAME_FRACTION,
                             "min_active_s": speech_evidence.MIN_ACTIVE_S,
                             "min_depth_db": speech_evidence.MIN_DEPTH_DB,
                             "min_dips_per_s": speech_evidence.MIN_DIPS_PER_S,
                             "min_rich_bins": speech_evidence.MIN_RICH_BINS}}
    for split in splits:
        started = time.perf_counter()
        negative_clips, found = negatives(split)
        negative_rows = judge(detector, negative_clips, f"{split} negatives")
        print(f"{split}: {len(negative_rows)} negatives judged", flush=True)
        positive_rows = judge(detector, positives(split, wm), f"{split} positives")
        result[split] = {"sources_found": found, "negatives": negative_summary(negative_rows),
                         "positives": positive_summary(positive_rows),
                         "seconds": round(time.perf_counter() - started, 1),
                         "per_clip": {"negatives": negative_rows, "positives": positive_rows}}
        print(f"{split}: done in {result[split]['seconds']} s", flush=True)
    return result
