"""benchmarks/speech_clips.py: eSpeak NG from the espeakng-loader wheel (no system package)
speaks, the same every run, and is the eSpeak NG that made the committed aligner fixture."""

from __future__ import annotations

import json
import sys

import numpy as np
from support.aligned_speech import DATA
from support.bench_modules import load_bench

clips = load_bench("speech_clips")


def test_it_speaks_the_same_audio_every_run():
    first = clips.speak("Please remember to switch off the lights.", "en-us", 170, 50)
    again = clips.speak("Please remember to switch off the lights.", "en-us", 170, 50)
    assert np.array_equal(first, again)
    assert 1.5 < first.size / clips.SAMPLE_RATE_HZ < 4.0  # seven words at 170 a minute
    assert np.sqrt(np.mean(first ** 2)) > 0.02  # sound, not silence
    assert clips.espeak().version().startswith("1.5")


def test_clips_reach_their_lengths_in_their_voices():
    made = clips.make_clips(2, 2.0, 4.0)
    assert [round(c.seconds, 2) for c in made] == [2.0, 4.0]
    assert all("+" in c.voice and c.text for c in made)  # voice+variant, as the command line takes


def test_it_is_the_speech_of_the_committed_fixture():
    """bench_alignment's first sentence, made again here: the same words and word edges as the
    committed fixture (made by the espeak-ng program, 1.51) within 50 ms."""
    bench = load_bench("bench_alignment")
    sentence = bench.build_corpus(0, limit=1, noise_rms=0.0)[0]
    fixture = json.loads((DATA / "aligned_sentence.json").read_text())
    assert sentence.text == fixture["text"]
    for (word, start, end), committed in zip(sentence.truth, fixture["words"], strict=True):
        assert word == committed["word"]
        assert abs(start - committed["start_s"]) < 0.05 and abs(end - committed["end_s"]) < 0.05, word


def test_two_copies_of_the_module_each_speak(monkeypatch):
    """The library holds one callback per process; a second copy of speech_clips (a benchmark
    imports it under its own name) set its own, and the first copy's clips came out empty."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("speech_clips_copy", clips.__file__)
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "speech_clips_copy", copy)
    spec.loader.exec_module(copy)
    for module in (clips, copy, clips):
        assert module.speak("Hello.", "en-us", 170, 50).size > 0.2 * module.SAMPLE_RATE_HZ
