"""Real speech for the last-mile measurements, made with eSpeak NG: the library and voice data the
`espeakng-loader` wheel carries (the `bench` and `test` extras), called through ctypes, so no
system package is needed. `speak(text, voice, rate_wpm, pitch)` is what `espeak-ng -v VOICE -s RATE
-p PITCH TEXT` says (the command line is a thin wrapper over the same library).

`make_clips(n)` returns n clips of 2-20 s, 24 kHz float32 mono, the same every run: clip i
speaks sentences picked by a seeded generator in one of several English voices, at its own
rate and pitch, until it reaches its target length (spread evenly over 2-20 s).
"""

from __future__ import annotations

import ctypes
import functools
import os
import random
from dataclasses import dataclass

import numpy as np
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


# espeak_lib.h: the synchronous output mode, UTF-8 text, the rate (words a minute) and pitch (0-100)
_AUDIO_OUTPUT_SYNCHRONOUS, _CHARS_UTF8, _RATE, _PITCH = 0x02, 1, 1, 3
# int callback(short *wav, int numsamples, espeak_EVENT *events): 0 = go on
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                   ctypes.c_void_p)


class _VoiceSpec(ctypes.Structure):  # espeak_VOICE: a voice chosen by its language ("en-gb+m3")
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p),
                ("identifier", ctypes.c_char_p), ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte),
                ("variant", ctypes.c_ubyte), ("xx1", ctypes.c_ubyte), ("score", ctypes.c_int),
                ("spare", ctypes.c_void_p)]


class _ESpeak:
    """The library, initialised once per process. Each utterance is spoken in a forked child of
    this just-initialised state, as the command line speaks each in a new process: the library
    keeps state from one utterance to the next (the same text spoken twice in one process differs
    by a few samples), so this is what makes a clip depend on its own arguments only."""

    def __init__(self):
        import espeakng_loader  # the wheel: libespeak-ng.so and espeak-ng-data beside it

        lib = self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                     ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(_VoiceSpec)]
        lib.espeak_Info.restype = ctypes.c_char_p
        self.rate_hz = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0,
                                             espeakng_loader.get_data_path().encode(), 0)
        if self.rate_hz <= 0:
            raise RuntimeError(f"eSpeak NG did not initialise ({self.rate_hz})")
        self._pieces: list[bytes] = []
        self._callback = _SYNTH_CALLBACK(self._collect)  # kept: the library holds the pointer
        lib.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav, count: int, events) -> int:
        if count > 0:
            self._pieces.append(ctypes.string_at(wav, 2 * count))
        return 0

    def version(self) -> str:
        return self.lib.espeak_Info(None).decode()

    def say(self, text: str, voice: str, rate_wpm: int, pitch: int) -> np.ndarray:
        """[n] int16 at self.rate_hz."""
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # the child: speak, send status + samples, and leave without cleanup
            status = b"ok"
            try:
                audio = self._speak_here(text, voice, rate_wpm, pitch)
            except (ValueError, RuntimeError) as error:
                status, audio = str(error).encode(), b""
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(len(status).to_bytes(4, "little") + status + audio)
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            answer = pipe.read()
        os.waitpid(child, 0)
        size = int.from_bytes(answer[:4], "little")
        if answer[4:4 + size] != b"ok":
            raise ValueError(answer[4:4 + size].decode() or "eSpeak NG died speaking")
        return np.frombuffer(answer[4 + size:], dtype="<i2")

    def _speak_here(self, text: str, voice: str, rate_wpm: int, pitch: int) -> bytes:
        # the library keeps one callback per process: another copy of this module (loaded under
        # another name) may have set its own since, so the child sets this one's again
        self.lib.espeak_SetSynthCallback(self._callback)
        # as the command line picks `-v VOICE`: a voice by name, else by language (+variant)
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            spec = _VoiceSpec(languages=voice.encode())
            if self.lib.espeak_SetVoiceByProperties(ctypes.byref(spec)) != 0:
                raise ValueError(f"eSpeak NG has no voice {voice!r}")
        self.lib.espeak_SetParameter(_RATE, rate_wpm, 0)
        self.lib.espeak_SetParameter(_PITCH, pitch, 0)
        data = text.encode()
        status = self.lib.espeak_Synth(data, len(data) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
        if status != 0:
            raise RuntimeError(f"eSpeak NG could not speak {text[:40]!r} (status {status})")
        return b"".join(self._pieces)


@functools.cache
def espeak() -> _ESpeak:
    return _ESpeak()


def speak(text: str, voice: str = "en", rate_wpm: int = 175, pitch: int = 50,
          rate_hz: int = SAMPLE_RATE_HZ) -> np.ndarray:
    """eSpeak NG's speech for `text`, resampled to `rate_hz` float32 (its native rate is 22050);
    the defaults are the command line's."""
    engine = espeak()
    audio = engine.say(text, voice, rate_wpm, pitch).astype(np.float32) / 32768.0
    return soxr.resample(audio, engine.rate_hz, rate_hz, quality="HQ").astype(np.float32)


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
