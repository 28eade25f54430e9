"""Word-timestamp accuracy on speech with exactly known word boundaries, and the aligner's CPU cost.

Ground truth: eSpeak NG (the `espeakng-loader` wheel, benchmarks/speech_clips.py) speaks each word of
`alignment_corpus.txt` to its own clip; each clip is trimmed to its sound (below), resampled to
24 kHz (the model's rate), and the clips of a sentence are joined with gaps drawn from a seeded
generator: GAP_NONE_SHARE of them 0 ms (running speech has no pause between most words), the
rest uniform in 10-100 ms, plus LEAD_S of silence before the sentence and after it. A faint
seeded noise floor (NOISE_RMS) covers the whole signal, so silence is not digital zero. Every
word's true start and end are then the edges of its trimmed clip on the joined timeline.

Trimming: a clip's envelope is the running maximum of |x| over ENVELOPE_S; the word starts at
the first sample whose envelope exceeds TRIM_DB below the clip's peak and ends after the last
such sample. eSpeak NG's own leading and trailing silence is cut this way for every clip alike,
and weak onsets (an /f/, an /h/) stay inside the word as long as they are within TRIM_DB of its peak.

Each sentence is aligned alone, as the server aligns each sentence of a response. Reported
(JSON): mean and p95 absolute start and end error over all words and per kind (dictionary
words; words with digits or symbols, read through the normaliser; words the dictionary lacks),
and the aligner's CPU seconds (this process's user+system time, /proc) per second of audio,
with the one-time model load apart. Acceptance (issue 42): mean <= 40 ms, p95 <= 100 ms.

    python benchmarks/last_mile/bench_alignment.py --out benchmarks/results/alignment_accuracy.json

`--fixture DIR` writes the corpus' first sentence instead (aligned_sentence.flac, 16-bit, and
aligned_sentence.json with its words' true edges; no noise floor): the unit tests' copy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import mean, now_iso, percentile, provenance, write_json  # noqa: E402
from speech_clips import espeak, speak  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "alignment_corpus.txt"
RATE_HZ = 24000  # the model's output rate: what the server hands the aligner
ENVELOPE_S = 0.005
TRIM_DB = 40.0
GAP_NONE_SHARE = 0.4
GAP_RANGE_S = (0.010, 0.100)
LEAD_S = 0.3
NOISE_RMS = 1e-4
ESPEAK_VOICE, ESPEAK_RATE_WPM = "en-us", 170  # `espeak-ng -v en-us -s 170`
MEAN_LIMIT_S, P95_LIMIT_S = 0.040, 0.100


@dataclass(frozen=True)
class Sentence:
    text: str
    audio: np.ndarray  # [n] float32 at RATE_HZ
    truth: list[tuple[str, float, float]]  # (word, start_s, end_s) per whitespace word


def speak_word(word: str) -> np.ndarray:
    """eSpeak NG's clip of one word, trimmed to its sound, at RATE_HZ."""
    return trim(speak(word, ESPEAK_VOICE, ESPEAK_RATE_WPM, rate_hz=RATE_HZ))


def trim(clip: np.ndarray) -> np.ndarray:
    width = max(1, int(ENVELOPE_S * RATE_HZ))
    level = np.abs(clip)
    envelope = np.array([level[max(0, i - width // 2): i + width // 2 + 1].max() for i in range(len(clip))]) \
        if len(clip) < width * 4 else np.maximum.reduce(
            [np.pad(level, (k, 0))[: len(level)] for k in range(width)])
    loud = np.nonzero(envelope > level.max() * 10 ** (-TRIM_DB / 20))[0]
    # the envelope runs `width` samples behind: the first loud sample is the envelope's first
    return clip[loud[0]: min(len(clip), loud[-1] + 1)] if len(loud) else clip[:0]


def build_sentence(text: str, rng: np.random.Generator, noise_rms: float = NOISE_RMS) -> Sentence:
    lead = int(LEAD_S * RATE_HZ)
    pieces, truth, cursor = [np.zeros(lead, np.float32)], [], lead
    words = text.split()
    for i, word in enumerate(words):
        clip = speak_word(word)
        truth.append((word, cursor / RATE_HZ, (cursor + len(clip)) / RATE_HZ))
        pieces.append(clip)
        cursor += len(clip)
        if i + 1 < len(words):
            gap = 0 if rng.random() < GAP_NONE_SHARE else int(rng.uniform(*GAP_RANGE_S) * RATE_HZ)
            pieces.append(np.zeros(gap, np.float32))
            cursor += gap
    pieces.append(np.zeros(lead, np.float32))
    audio = np.concatenate(pieces)
    audio = audio + rng.normal(0.0, noise_rms, len(audio)).astype(np.float32)
    return Sentence(text, audio.astype(np.float32), truth)


def build_corpus(seed: int, limit: int | None = None, noise_rms: float = NOISE_RMS) -> list[Sentence]:
    rng = np.random.default_rng(seed)
    lines = [line.strip() for line in CORPUS.read_text().splitlines() if line.strip()][:limit]
    return [build_sentence(line, rng, noise_rms) for line in lines]


def write_fixture(directory: Path, sentence: Sentence) -> int:
    import json

    directory.mkdir(parents=True, exist_ok=True)
    sf.write(directory / "aligned_sentence.flac", sentence.audio, RATE_HZ, subtype="PCM_16")
    (directory / "aligned_sentence.json").write_text(json.dumps({
        "text": sentence.text, "sample_rate_hz": RATE_HZ, "made_by": "benchmarks/last_mile/bench_alignment.py --fixture",
        "words": [{"word": w, "start_s": round(a, 5), "end_s": round(b, 5)} for w, a, b in sentence.truth]}, indent=1))
    print(f"wrote {directory}/aligned_sentence.flac and .json")
    return 0


def cpu_s() -> float:
    """This process's user + system CPU seconds (from /proc via os.times)."""
    times = os.times()
    return times.user + times.system


def word_kind(word: str, aligner) -> str:
    from higgs_serve.alignment.english_text import spoken_tokens

    if any(not c.isalpha() for c in word.strip(".,;:!?\"'")):
        return "normalised"
    tokens = spoken_tokens(word)
    return "dictionary" if all(aligner._decoder.lookup_word(t) is not None for t in tokens) else "unknown"


def summarise(errors: list[tuple[float, float]]) -> dict:
    starts, ends = [s for s, _ in errors], [e for _, e in errors]
    both = starts + ends
    ms = lambda value: None if value is None else round(1e3 * value, 1)  # noqa: E731
    return {"words": len(errors), "start_mean_ms": ms(mean(starts)), "start_p95_ms": ms(percentile(starts, 95)),
            "end_mean_ms": ms(mean(ends)), "end_p95_ms": ms(percentile(ends, 95)),
            "boundary_mean_ms": ms(mean(both)), "boundary_p95_ms": ms(percentile(both, 95)),
            "boundary_max_ms": ms(max(both) if both else None)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/alignment_accuracy.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixture", metavar="DIR", help="write the first sentence as a test fixture and stop")
    args = parser.parse_args(argv)
    started = now_iso()
    if args.fixture:
        # without the noise floor, which would not compress (the tests add their own)
        return write_fixture(Path(args.fixture), build_corpus(args.seed, limit=1, noise_rms=0.0)[0])
    from higgs_serve.alignment import user_words
    from higgs_serve.alignment.pocketsphinx_aligner import PocketsphinxAligner

    corpus = build_corpus(args.seed)
    before = cpu_s()
    aligner = PocketsphinxAligner()
    load_cpu_s = cpu_s() - before
    # classified before any alignment: aligning adds the unknown words' made-up pronunciations
    kinds = [[word_kind(word, aligner) for word, _, _ in sentence.truth] for sentence in corpus]
    errors: dict[str, list[tuple[float, float]]] = {"dictionary": [], "normalised": [], "unknown": []}
    worst: list[dict] = []
    align_cpu_s = audio_s = 0.0
    for sentence, sentence_kinds in zip(corpus, kinds):
        before = cpu_s()
        timings = aligner.align(sentence.audio, RATE_HZ, user_words(sentence.text))
        align_cpu_s += cpu_s() - before
        audio_s += len(sentence.audio) / RATE_HZ
        assert [t.word for t in timings] == [w for w, _, _ in sentence.truth]
        for timing, (word, start, end), kind in zip(timings, sentence.truth, sentence_kinds):
            error = (abs(timing.start_s - start), abs(timing.end_s - end))
            errors[kind].append(error)
            worst.append({"word": word, "sentence": sentence.text[:40], "start_error_ms": round(1e3 * error[0]),
                          "end_error_ms": round(1e3 * error[1])})
    every = [e for kind in errors.values() for e in kind]
    overall = summarise(every)
    worst.sort(key=lambda w: -max(w["start_error_ms"], w["end_error_ms"]))
    result = {
        **provenance("bench_alignment", started),
        "loadavg": os.getloadavg(),
        "espeak_ng": espeak().version(),
        "ground_truth": {"espeak_args": ["-v", ESPEAK_VOICE, "-s", str(ESPEAK_RATE_WPM)], "trim_db_below_peak": TRIM_DB, "envelope_s": ENVELOPE_S,
                         "gap_none_share": GAP_NONE_SHARE, "gap_range_s": list(GAP_RANGE_S), "lead_s": LEAD_S,
                         "noise_rms": NOISE_RMS, "seed": args.seed, "sentences": len(corpus)},
        "overall": overall,
        "by_kind": {kind: summarise(values) for kind, values in errors.items()},
        "cpu": {"audio_s": round(audio_s, 2), "align_cpu_s": round(align_cpu_s, 3),
                "cpu_s_per_audio_s": round(align_cpu_s / audio_s, 4), "model_load_cpu_s": round(load_cpu_s, 3)},
        "acceptance": {"mean_limit_ms": 1e3 * MEAN_LIMIT_S, "p95_limit_ms": 1e3 * P95_LIMIT_S,
                       "passed": overall["boundary_mean_ms"] <= 1e3 * MEAN_LIMIT_S
                       and overall["boundary_p95_ms"] <= 1e3 * P95_LIMIT_S},
        "worst_words": worst[:10],
    }
    write_json(args.out, result)
    print(f"{overall['words']} words: start mean {overall['start_mean_ms']} ms p95 {overall['start_p95_ms']} ms, "
          f"end mean {overall['end_mean_ms']} ms p95 {overall['end_p95_ms']} ms; "
          f"CPU {result['cpu']['cpu_s_per_audio_s']} s per audio s -> {args.out}")
    for kind, summary in result["by_kind"].items():
        print(f"  {kind}: {summary}")
    return 0 if result["acceptance"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
