"""`higgs-serve synth` with a text past --segment-max-chars: one recording per text
(NNNN.wav) and its segment timestamps (NNNN.segments.json); and the `serve` long-form flags
reaching the server settings."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from higgs_serve import cli
from higgs_serve.text import group_segments

TEXT = "First sentence is here. Second sentence is here. And a third one, to end with."
FRAMES = 5


def _args(model_dir, out_dir, *extra):
    return ["--log-level", "WARNING", "synth", "--model", str(model_dir), "--output-dir",
            str(out_dir), "--device", "cpu", "--seed", "1", "--max-new-tokens", str(FRAMES),
            "--segment-max-chars", "40", "--text", "Short.", "--text", TEXT, *extra]


def test_long_text_is_one_recording_with_timestamps(tiny_model_dir, tmp_path):
    assert cli.main(_args(tiny_model_dir, tmp_path)) == 0
    audio, rate = sf.read(tmp_path / "0001.wav", dtype="float32")
    timings = json.loads((tmp_path / "0001.segments.json").read_text())
    segments = group_segments(TEXT, 40)
    assert len(timings) == len(segments) == 3
    assert [(t["char_start"], t["char_end"]) for t in timings] == [(s.start, s.end) for s in segments]
    assert timings[-1]["end_s"] == pytest.approx(len(audio) / rate)
    assert len(audio) == 3 * FRAMES * 960
    assert (tmp_path / "0000.npz").exists()  # the short text took the ordinary path
    assert not (tmp_path / "0001.npz").exists()
    assert np.abs(audio).max() > 0


def test_stream_check_refuses_long_texts(tiny_model_dir, tmp_path, capsys):
    assert cli.main(_args(tiny_model_dir, tmp_path, "--stream")) == 2
    assert "--segment-max-chars" in capsys.readouterr().err


def test_serve_flags_reach_the_settings(tiny_model_dir, monkeypatch):
    seen = {}
    monkeypatch.setattr("higgs_serve.server.app.run_server",
                        lambda model, settings, *a, **k: seen.setdefault("settings", settings))
    assert cli.main(["serve", str(tiny_model_dir), "--device", "cpu", "--segment-max-chars", "50",
                     "--max-audio-s", "12.5", "--ws-idle-timeout-s", "3",
                     "--max-input-chars", "999"]) == 0
    settings = seen["settings"]
    assert (settings.segment_max_chars, settings.max_audio_s, settings.ws_idle_timeout_s,
            settings.max_input_chars) == (50, 12.5, 3.0, 999)
