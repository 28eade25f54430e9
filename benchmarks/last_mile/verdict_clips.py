"""The clips bench_watermark.py's `verdict` section judges: a negative set (nothing in it carries
the mark) and a positive set (speech marked by us, then transformed), each in two splits that
share no source file and no generator seed: `calibration` (the detector's minimums were chosen
on it) and `evaluation` (reported, never tuned on).

Negatives, made here (NumPy, seeded): 1-8 s each: pure tones (40 Hz-11 kHz, -50 to -1 dBFS), tones pulsed
at 2-8 Hz (beeps), chords of 2-5 notes with and without harmonics, sweeps, silence (digital zero,
dither, a DC offset), white, pink and brown noise, noise in syllable-rate bursts, melodies of
harmonic notes (synthetic music), drum-like patterns, and clipped versions of tones, melodies
and speech. Negatives not made here (each source's files split between the splits):
- real human speech: the Asterisk PBX prompts (Debian's `asterisk-core-sounds-en-wav`, one
  recorded English speaker, 8 kHz), joined into 2-12 s clips, plain and clipped;
- real music: Asterisk's music on hold (`asterisk-moh-opsound-wav`, 5 tracks, 8 kHz) and
  LiveKit Agents' hold music (the `livekit-agents` wheel, a test dependency);
- real ambience: LiveKit Agents' crowded room (many voices), office, city, forest and keyboard
  recordings.
Unmarked espeak-ng speech (made here) is a negative too. Positives: espeak-ng clips
(benchmarks/speech_clips.py) and Asterisk speech clips, marked whole (`embed`), unchanged and
after mp3 64 kbit/s, opus 32 kbit/s and G.711 mu-law at 8 kHz (PyAV's encoders: no ffmpeg
binary needed). A source that is not installed is skipped and named in the result.
"""

from __future__ import annotations

import glob
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from speech_clips import SAMPLE_RATE_HZ as R, make_clips  # noqa: E402

ASTERISK_SPEECH = "/usr/share/asterisk/sounds/en_US_f_Allison"
ASTERISK_MUSIC = "/usr/share/asterisk/moh"
SPLITS = {"calibration": 0, "evaluation": 1}


@dataclass
class Clip:
    kind: str  # what it is (tone, chord, music_real, speech_real, ...)
    name: str
    audio: np.ndarray  # [n] float32
    rate_hz: int = R

    @property
    def seconds(self) -> float:
        return self.audio.size / self.rate_hz


def livekit_resources() -> Path | None:
    try:
        import livekit.agents.resources as res
    except ImportError:
        return None
    return Path(res.__file__).parent


def load(path: str | Path) -> np.ndarray:
    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    return soxr.resample(audio.mean(axis=1), rate, R).astype(np.float32)


# ----------------------------------------------------------------------------- made here
def _t(seconds: float) -> np.ndarray:
    return np.arange(int(seconds * R)) / R


def _db(rng) -> float:
    return 10 ** (rng.uniform(-50, -1) / 20)


def _note(freq: float, seconds: float, harmonics: int, rng) -> np.ndarray:
    t = _t(seconds)
    wave = sum(np.sin(2 * np.pi * freq * k * t + rng.uniform(0, 6)) / k ** rng.uniform(0.8, 2.0)
               for k in range(1, harmonics + 1) if freq * k < R / 2)
    envelope = np.minimum(1.0, t / 0.01) * np.exp(-t * rng.uniform(0.5, 6.0))  # attack, decay
    return wave * envelope


def _noise(kind: str, n: int, rng) -> np.ndarray:
    white = rng.standard_normal(n)
    if kind == "white":
        return white
    spectrum = np.fft.rfft(white)
    f = np.maximum(np.arange(spectrum.size), 1)
    noise = np.fft.irfft(spectrum / (np.sqrt(f) if kind == "pink" else f), n)
    return noise / np.abs(noise).max()


def _norm(audio: np.ndarray, peak: float) -> np.ndarray:
    top = np.abs(audio).max()
    return (audio * (peak / top) if top > 0 else audio).astype(np.float32)


def synthetic(count_per_kind: int, seed: int, speech: list[np.ndarray]) -> list[Clip]:
    """Every made-here negative kind, `count_per_kind` each (clipped speech from `speech`)."""
    rng = np.random.default_rng(seed)
    out: list[Clip] = []

    def add(kind: str, audio: np.ndarray) -> None:
        out.append(Clip(kind, f"{kind}_{len(out)}", np.asarray(audio, np.float32)))

    def secs() -> float:
        return float(rng.uniform(1.0, 8.0))

    for _ in range(count_per_kind):
        freq = float(np.exp(rng.uniform(np.log(40), np.log(11_000))))
        add("tone", _db(rng) * np.sin(2 * np.pi * freq * _t(secs())))
        t = _t(secs())
        gate = (np.sin(2 * np.pi * rng.uniform(2, 8) * t) > rng.uniform(-0.5, 0.5)).astype(float)
        add("tone_pulsed", _db(rng) * gate * np.sin(2 * np.pi * float(np.exp(rng.uniform(np.log(100), np.log(4000)))) * t))
        root, t = float(rng.uniform(80, 600)), _t(secs())
        notes = root * 2 ** (np.cumsum(rng.choice([3, 4, 5, 7], size=rng.integers(2, 6))) / 12)
        harmonics = int(rng.integers(1, 6))
        add("chord", _norm(sum(sum(np.sin(2 * np.pi * f * k * t) / k for k in range(1, harmonics + 1)) for f in notes),
                           _db(rng)))
        t = _t(secs())
        f0, f1 = np.exp(rng.uniform(np.log(50), np.log(8000), size=2))
        add("sweep", _db(rng) * np.sin(2 * np.pi * np.cumsum(np.geomspace(f0, f1, t.size)) / R))
        add("silence", np.zeros(int(secs() * R)) + rng.choice([0.0, 1e-3, -0.01]))
        add("silence_dither", rng.standard_normal(int(secs() * R)) * 10 ** (rng.uniform(-90, -70) / 20))
        for kind in ("white", "pink", "brown"):
            add(f"noise_{kind}", _norm(_noise(kind, int(secs() * R), rng), _db(rng)))
        t = _t(secs())
        bursts = np.clip(np.sin(2 * np.pi * rng.uniform(2, 7) * t), 0, 1) ** 2
        add("noise_bursts", _norm(_noise(str(rng.choice(["white", "pink"])), t.size, rng) * bursts, _db(rng)))
        add("melody", _norm(_melody(secs(), rng), _db(rng)))
        add("drums", _norm(_drums(secs(), rng), _db(rng)))
        gain = 10 ** (rng.uniform(6, 30) / 20)
        source = [_melody(secs(), rng), np.sin(2 * np.pi * rng.uniform(60, 2000) * _t(secs())),
                  speech[int(rng.integers(len(speech)))]][int(rng.integers(3))]
        add("clipped", np.clip(_norm(source, 0.5) * gain, -1.0, 1.0))
    return out


def _melody(seconds: float, rng) -> np.ndarray:
    n, out, pos = int(seconds * R), np.zeros(int(seconds * R)), 0
    beat = 60.0 / rng.uniform(60, 240)
    base = rng.uniform(110, 440)
    while pos < n:
        length = beat * rng.choice([0.5, 1, 1, 2])
        note = _note(base * 2 ** (rng.integers(-5, 13) / 12), length, int(rng.integers(1, 8)), rng)
        out[pos: pos + note.size] += note[: n - pos]
        pos += note.size
    return out


def _drums(seconds: float, rng) -> np.ndarray:
    n, out = int(seconds * R), np.zeros(int(seconds * R))
    step = int(R * 60.0 / rng.uniform(80, 180) / 2)
    for pos in range(0, n, step):
        hit = int(rng.integers(3))
        length = min(int(R * 0.2), n - pos)
        t = np.arange(length) / R
        sound = (np.sin(2 * np.pi * 60 * t * np.exp(-t * 20)) if hit == 0 else rng.standard_normal(length))
        out[pos: pos + length] += sound * np.exp(-t * (15 if hit == 0 else 40))
    return out


# ----------------------------------------------------------------------------- not made here
def asterisk_speech(split: int, min_s: float, max_s: float, count: int, seed: int) -> list[np.ndarray]:
    """`count` clips of real speech, min_s..max_s each (spread evenly), from every other prompt
    file (split 0: even, 1: odd), joined in a seeded order with their own silences."""
    files = sorted(glob.glob(f"{ASTERISK_SPEECH}/**/*.wav", recursive=True))[split::2]
    if not files:
        return []
    rng = np.random.default_rng(seed)
    prompts = [load(f) for f in files]
    order, out, at = rng.permutation(len(prompts)), [], 0
    for i in range(count):
        target = min_s + (max_s - min_s) * i / max(count - 1, 1)
        pieces, length = [], 0
        while length < target * R:
            piece = prompts[order[at % len(order)]]
            at += 1
            pieces.append(piece)
            length += piece.size
        out.append(np.concatenate(pieces)[: int(target * R)])
    return out


def real_recordings(split: int, seed: int) -> tuple[list[Clip], list[str]]:
    """Music and ambience recordings not made here, cut into 2-10 s pieces; the sources found."""
    rng = np.random.default_rng(seed)
    music = sorted(glob.glob(f"{ASTERISK_MUSIC}/*.wav"))
    ambience: list[Path] = []
    resources = livekit_resources()
    if resources is not None:
        music.append(str(resources / "hold_music.ogg"))
        ambience = sorted(p for p in resources.glob("*.ogg") if p.name != "hold_music.ogg")
    clips, found = [], []
    for kind, files in (("music_real", music[split::2]), ("ambience_real", ambience[split::2])):
        for path in files:
            found.append(Path(path).name)
            audio, pos = load(path), 0
            while pos < audio.size - R:
                length = int(rng.uniform(2, 10) * R)
                clips.append(Clip(kind, f"{Path(path).stem}@{pos / R:.0f}s", audio[pos: pos + length]))
                pos += length
    return clips, found


# ----------------------------------------------------------------------------- transformations
def av_roundtrip(audio: np.ndarray, codec: str, container: str, bit_rate: int | None,
                 rate_hz: int = R) -> tuple[np.ndarray, int]:
    """24 kHz float32 -> encoded by PyAV (`codec` in `container` at `rate_hz`) -> decoded back to
    float32 at rate_hz."""
    import av

    if rate_hz != R:
        audio = soxr.resample(audio, R, rate_hz).astype(np.float32)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate_hz, layout="mono")
        if bit_rate:
            stream.bit_rate = bit_rate
        # PyAV converts the frame to the codec's sample format and frame size on encode
        frame = av.AudioFrame.from_ndarray(np.clip(audio, -1, 1)[None, :].astype(np.float32), format="fltp",
                                           layout="mono")
        frame.sample_rate = rate_hz
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    buffer.seek(0)
    pieces = []
    with av.open(buffer, "r") as src:
        to_float = av.AudioResampler(format="flt", layout="mono", rate=rate_hz)
        for frame in src.decode(audio=0):
            pieces += [f.to_ndarray()[0] for f in to_float.resample(frame)]
    return np.concatenate(pieces).astype(np.float32), rate_hz


TRANSFORMS = {
    "unchanged": lambda a: (a, R),
    "mp3_64k": lambda a: av_roundtrip(a, "libmp3lame", "mp3", 64_000),
    "opus_32k": lambda a: av_roundtrip(a, "libopus", "ogg", 32_000),
    "mulaw_8k": lambda a: av_roundtrip(a, "pcm_mulaw", "wav", None, 8000),
}


def espeak_speech(count: int, seed: int, max_s: float = 20.0) -> list[np.ndarray]:
    return [c.audio for c in make_clips(count, 2.0, max_s, seed=seed)]
