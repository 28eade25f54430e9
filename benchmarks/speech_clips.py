"""Real speech clips for the watermark measurements, made with espeak-ng (a Debian package).

`make_clips(n)` returns n clips of 2-20 s, 24 kHz float32 mono, the same every run: clip i
speaks sentences picked by a seeded generator in one of several English voices, at its own
rate and pitch, until it reaches its target length (spread evenly over 2-20 s).
"""

from __future__ import annotations

import io
import random
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE_HZ = 24_000

SENTENCES = (
    "The morning train to the coast was late again, so we waited on the cold platform.",
    "Please remember to switch off the lights in the meeting room before you leave.",
    "Seven hundred and forty two parcels were sorted by hand on Tuesday night.",
    "She said the garden looked better after the rain than it had all summer.",
    "Could you tell me the way to the nearest pharmacy, or is it closed today?",
    "Our quarterly results show a steady rise in sales across every northern region.",
    "He carried the old wooden chair up three flights of stairs without a word.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "If the bridge is closed tomorrow, the ferry will run every twenty minutes.",
    "A small brown dog followed the children all the way home from school.",
    "Thunderstorms are expected over the hills this evening, with strong gusts of wind.",
    "I have read that book twice and I still do not understand the ending.",
    "The museum opens at nine, but the new gallery will stay closed until spring.",
    "Turn left at the second roundabout and park behind the yellow building.",
    "Nobody noticed that the clock in the hall had stopped at a quarter past four.",
    "Your appointment has been moved to Thursday afternoon at half past two.",
    "The orchestra tuned their instruments while the audience slowly found their seats.",
    "We measured the temperature every hour and wrote the numbers in a notebook.",
    "Fresh bread, ripe tomatoes and a little olive oil make a fine lunch.",
    "The committee will publish its decision after the hearing next month.",
    "My grandmother grew up in a village with one shop and no paved roads.",
    "Flight four one seven to Lisbon is now boarding at gate twenty three.",
    "Quietly, the cat climbed onto the windowsill and watched the birds outside.",
    "Engineers replaced the worn cables before the winter storms arrived.",
    "Is this the right number for customer support, or should I call another line?",
    "The river froze so hard that year that people walked across it to town.",
    "Every student must hand in the essay by Friday at five o'clock.",
    "Light travels from the sun to the earth in a little over eight minutes.",
    "They painted the front door green and planted roses along the fence.",
    "Thank you for waiting; your call is important to us and will be answered shortly.",
    "The doctor recommended more sleep, less coffee and a walk after dinner.",
    "Hundreds of volunteers cleaned the beach on Saturday morning.",
    "When the power failed, we lit candles and told stories until midnight.",
    "The price of the ticket includes a guided tour and a cup of tea.",
    "Somewhere in the distance a church bell rang twelve times.",
    "Check the tyre pressure before any long drive, especially in winter.",
    "The library keeps rare maps in a cool room on the top floor.",
    "After years of practice, he finally played the sonata without a mistake.",
    "Interest rates stayed the same, as most economists had predicted.",
    "Bring a warm coat; the evenings in the mountains can be surprisingly cold.",
)

VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-029", "en-gb-x-rp", "en-us-nyc", "en-gb-x-gbclan")
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m7", "f1", "f2", "f3", "f4", "f5", "klatt", "klatt3", "croak")


@dataclass(frozen=True)
class Clip:
    index: int
    voice: str
    rate_wpm: int
    pitch: int
    text: str
    audio: np.ndarray  # [n] float32 at 24 kHz

    @property
    def seconds(self) -> float:
        return self.audio.size / SAMPLE_RATE_HZ


def speak(text: str, voice: str, rate_wpm: int, pitch: int) -> np.ndarray:
    """espeak-ng's speech for `text`, resampled to 24 kHz float32 (its native rate is 22050)."""
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is needed to make speech clips (apt-get install espeak-ng)")
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate_wpm), "-p", str(pitch), "--stdout", text],
                         check=True, capture_output=True).stdout
    audio, rate_hz = sf.read(io.BytesIO(wav), dtype="float32")
    return soxr.resample(audio, rate_hz, SAMPLE_RATE_HZ).astype(np.float32)


def make_clips(count: int, min_seconds: float = 2.0, max_seconds: float = 20.0, seed: int = 43) -> list[Clip]:
    rng = random.Random(seed)
    clips = []
    for index in range(count):
        target_s = min_seconds + (max_seconds - min_seconds) * index / max(count - 1, 1)
        voice = f"{rng.choice(VOICES)}+{rng.choice(VARIANTS)}"
        rate_wpm, pitch = rng.randint(130, 220), rng.randint(25, 75)
        words: list[str] = []
        audio = np.zeros(0, np.float32)
        while audio.size < target_s * SAMPLE_RATE_HZ:
            words.append(rng.choice(SENTENCES))
            audio = speak(" ".join(words), voice, rate_wpm, pitch)
        # the last sentence may overshoot: cut at the target length (a fade keeps the cut silent)
        audio = audio[: int(max(target_s, min_seconds) * SAMPLE_RATE_HZ)].copy()
        fade = min(480, audio.size)
        audio[-fade:] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
        clips.append(Clip(index, voice, rate_wpm, pitch, " ".join(words), audio))
    return clips
