"""`higgs-serve synth` with a text past --segment-max-chars: one recording per text
(NNNN.wav) and its segment timestamps (NNNN.segments.json); and the `serve` long-form flags
reaching the server settings."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import soundfile as sf

from higgs_serve import cli
from higgs_serve.alignment import user_words
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


@pytest.fixture
def port_8000_taken():
    """The README's own example serves on 8000: this test must pass while something does
    (issue 40 item 11: it bound 8000 itself and failed when the port was in use)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", 8000))
            sock.listen()
        except OSError:
            pass  # already taken by someone else: the same situation
        yield


def test_serve_flags_reach_the_settings(tiny_model_dir, monkeypatch, port_8000_taken):
    seen = {}
    monkeypatch.setattr("higgs_serve.server.app.run_server",
                        lambda model, settings, *a, **k: seen.setdefault("settings", settings))
    assert cli.main(["serve", str(tiny_model_dir), "--device", "cpu", "--port", "0",
                     "--segment-max-chars", "50",
                     "--max-audio-s", "12.5", "--ws-idle-timeout-s", "3",
                     "--max-input-chars", "999"]) == 0
    settings = seen["settings"]
    assert (settings.segment_max_chars, settings.max_audio_s, settings.ws_idle_timeout_s,
            settings.max_input_chars) == (50, 12.5, 3.0, 999)


def test_word_timestamps_beside_each_file(tiny_model_dir, tmp_path, capsys):
    """--word-timestamps: OUT/NNNN.words.json, one entry per word of the text (tags removed), in
    order, inside the audio; the long text's words on the recording's one timeline, each inside
    its segment. With the tiny model's noise the times say nothing about speech, only the contract."""
    tagged = "<|emotion:happy|>" + TEXT
    argv = _args(tiny_model_dir, tmp_path, "--word-timestamps")
    argv[argv.index(TEXT)] = tagged
    argv[argv.index("--max-new-tokens") + 1] = "40"  # 1.6 s per segment: room for its words
    assert cli.main(argv) == 0
    assert "0001.words.json" in capsys.readouterr().out
    for request_id, text in (("0000", "Short."), ("0001", tagged)):
        audio, rate = sf.read(tmp_path / f"{request_id}.wav", dtype="float32")
        words = json.loads((tmp_path / f"{request_id}.words.json").read_text())
        assert [w["word"] for w in words] == TEXT.split() if request_id == "0001" else ["Short."]
        ends = [0] + [w["end_ms"] for w in words]
        for previous_end, word in zip(ends, words):
            assert previous_end <= word["start_ms"] <= word["end_ms"] <= 1e3 * len(audio) / rate + 1
    segments = json.loads((tmp_path / "0001.segments.json").read_text())
    words = json.loads((tmp_path / "0001.words.json").read_text())
    assert len(segments) == 3
    for segment in segments:  # each segment's words, in turn, lie inside it
        count = len(user_words(tagged[segment["char_start"]:segment["char_end"]]))
        mine, words = words[:count], words[count:]
        assert all(1e3 * segment["start_s"] - 1 <= w["start_ms"] <= w["end_ms"] <= 1e3 * segment["end_s"] + 1
                   for w in mine)
    assert words == []


def test_word_timestamps_refuse_text_the_aligner_cannot_read(tiny_model_dir, tmp_path, capsys):
    argv = _args(tiny_model_dir, tmp_path, "--word-timestamps", "--text", "你好，世界。")
    assert cli.main(argv) == 2
    assert "--word-timestamps: text 0002 is not in Latin script" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before the model loaded


def test_word_timestamps_of_audio_too_short_are_null(tiny_model_dir, tmp_path, capsys):
    """5 frames (0.2 s) per segment cannot hold a four-word sentence: its words keep their place
    with null times, the run says so, and the audio is written as ever."""
    assert cli.main(_args(tiny_model_dir, tmp_path, "--word-timestamps")) == 0
    assert "could not be aligned" in capsys.readouterr().out
    words = json.loads((tmp_path / "0001.words.json").read_text())
    assert [w["word"] for w in words] == TEXT.split()
    assert any(w["start_ms"] is None for w in words)
    assert (tmp_path / "0001.wav").exists()


def test_the_summary_counts_long_texts_and_their_progress_is_shown(tiny_model_dir, tmp_path, capsys,
                                                                   caplog):
    """Issue 40 item 11: one long --text printed `0 request(s)`; and a long text reported no
    progress until it was done."""
    args = ["--log-level", "INFO", "synth", str(tiny_model_dir), "--output-dir", str(tmp_path),
            "--device", "cpu", "--seed", "1", "--max-new-tokens", str(FRAMES),
            "--segment-max-chars", "40", "--text", TEXT]
    caplog.set_level("INFO", logger="higgs_serve.progress")
    assert cli.main(args) == 0
    audio_s = 3 * FRAMES * 960 / 24000
    assert f"1 request(s): {audio_s:.2f} s of audio" in capsys.readouterr().out
    progress = [r.getMessage() for r in caplog.records if r.name == "higgs_serve.progress"]
    assert any(line.startswith("0000 (long-form): 3/3 (100%)") for line in progress), progress
