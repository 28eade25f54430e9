"""The watermark at the command line: `synth` marks by default and says in one line when it does
not; `--watermark` and the deploy key switch it; `higgs-serve detect` reads files (and headerless
samples) and says which carry the mark; with the mark on and its model missing, nothing starts."""

from __future__ import annotations

import json
import logging

import pytest
import soundfile as sf

from higgs_serve.audio.perth import network as perth
from higgs_serve.cli import main

FRAMES = "125"  # 5 s


def _synth(model_dir, out_dir, *extra) -> int:
    return main(["--log-level", "INFO", "synth", str(model_dir), "--text", "Hello there.", "--output-dir", str(out_dir),
                 "--device", "cpu", "--seed", "3", "--max-new-tokens", FRAMES, *extra])


@pytest.fixture(scope="module")
def outputs(tiny_model_dir, tmp_path_factory):
    on, off = tmp_path_factory.mktemp("on"), tmp_path_factory.mktemp("off")
    assert _synth(tiny_model_dir, on) == 0
    assert _synth(tiny_model_dir, off, "--watermark", "off") == 0
    return on / "0000.wav", off / "0000.wav"


def test_synth_marks_by_default_and_detect_tells_marked_from_unmarked(outputs, capsys):
    """The tiny model's audio is not speech: the verdict is `inconclusive` for both files
    (audio/watermark_detect.py), and the network's score tells the marked one from the other."""
    on, off = outputs
    capsys.readouterr()
    assert main(["detect", str(on), str(off)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{on}: inconclusive: too little speech") and lines[1].startswith(f"{off}: inconclusive")
    assert main(["detect", "--json", str(on), str(off)]) == 0
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert found[0]["file"] == str(on) and found[0]["score"] >= 0.9 and found[1]["score"] < 0.1
    assert [f["detected"] for f in found] == [False, False] and {f["verdict"] for f in found} == {"inconclusive"}


def test_detect_says_marked_only_for_speech(tmp_path, capsys):
    """Speech-like audio marked by the watermark is `marked`, the same unmarked `not marked`."""
    from higgs_serve.audio.watermark import embed, load_watermarker
    from support.speechlike import speechlike

    audio = speechlike(6.0, 11)
    sf.write(tmp_path / "marked.wav", embed(load_watermarker(), audio), 24_000)
    sf.write(tmp_path / "plain.wav", audio, 24_000)
    capsys.readouterr()
    assert main(["detect", str(tmp_path / "marked.wav"), str(tmp_path / "plain.wav")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'marked.wav'}: marked (score ")
    assert lines[1].startswith(f"{tmp_path / 'plain.wav'}: not marked (score ")


def test_a_file_past_the_size_limit_is_refused_before_it_is_read(tmp_path, capsys):
    """Issue 52: a 1 GiB file was read whole before it was refused (as "not a supported audio
    file"); now its size refuses it first."""
    from higgs_serve.audio import watermark_detect

    big = tmp_path / "big.wav"
    with open(big, "wb") as handle:  # sparse: no bytes written, 1 GiB long
        handle.truncate(2**30)
    assert main(["detect", str(big)]) == 2
    assert f"{2**30} bytes; detection reads files of at most {watermark_detect.DETECT_MAX_BYTES // 2**20} MiB" \
        in capsys.readouterr().err


def test_headerless_samples_are_read_with_format_and_rate(outputs, tmp_path, capsys):
    on, _ = outputs
    audio, rate = sf.read(on, dtype="int16")
    raw = tmp_path / "on.pcm"
    raw.write_bytes(audio.astype("<i2").tobytes())
    capsys.readouterr()
    assert main(["detect", "--json", "--format", "pcm", "--sample-rate", str(rate), str(raw)]) == 0
    assert json.loads(capsys.readouterr().out)["score"] >= 0.9
    assert main(["detect", "--sample-rate", "16000", str(raw)]) == 2
    assert "--sample-rate is the rate of headerless FILEs: give --format too" in capsys.readouterr().err


def test_a_bad_file_fails_before_anything_is_detected(outputs, tmp_path, capsys):
    on, _ = outputs
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio at all" * 10)
    capsys.readouterr()
    assert main(["detect", str(on), str(junk)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the good file before it was not reported either
    assert captured.err.count("\n") == 1 and f"FILE {junk} is not a supported audio file" in captured.err


def test_watermark_off_says_so_in_one_line(tiny_model_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert _synth(tiny_model_dir, tmp_path, "--watermark", "off") == 0
    off_lines = [r.getMessage() for r in caplog.records if "watermark" in r.getMessage()]
    assert off_lines == ["watermark off: generated audio is not marked as AI-generated (turn it on with "
                         "--watermark on or `watermark: true` in the deploy config)"]


def test_the_deploy_key_and_the_flag(tiny_model_dir, tmp_path, capsys):
    profile = tmp_path / "unmarked.yaml"
    profile.write_text("base_config: higgs_multimodal_qwen3.yaml\nwatermark: false\n")
    capsys.readouterr()
    assert main(["config", "show", str(tiny_model_dir), "--device", "cpu", "--deploy-config", str(profile)]) == 0
    assert json.loads(capsys.readouterr().out)["watermark"] is False
    assert main(["config", "show", str(tiny_model_dir), "--device", "cpu", "--deploy-config", str(profile),
                 "--watermark", "on"]) == 0
    assert json.loads(capsys.readouterr().out)["watermark"] is True
    profile.write_text("base_config: higgs_multimodal_qwen3.yaml\nwatermark: maybe\n")
    assert main(["config", "show", str(tiny_model_dir), "--device", "cpu", "--deploy-config", str(profile)]) == 2
    assert "watermark" in capsys.readouterr().err


def test_no_model_no_start(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """With the mark on, a missing watermark model stops synth and serve before any load, in one
    line; with it off they would run."""
    monkeypatch.setattr(perth, "CHECKPOINT_RELPATH", ("no_such_model.pth.tar",))
    out = tmp_path / "out"
    assert _synth(tiny_model_dir, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "higgs-serve: error: resemble-perth is installed but its trained model is missing" in err
    assert not (out / "0000.wav").exists()
    assert main(["serve", str(tiny_model_dir), "--device", "cpu", "--port", "0"]) == 2
    assert "its trained model is missing" in capsys.readouterr().err
    monkeypatch.setattr(perth.importlib.util, "find_spec", lambda name: None)
    assert _synth(tiny_model_dir, out) == 2
    assert "the watermark needs the resemble-perth package" in capsys.readouterr().err


def test_dummy_weights_need_no_trained_watermark(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """--load-format dummy runs every network with random weights, the watermark's too: no
    trained file is needed (the GPU benchmarks carry none), and the log says the mark is random."""
    monkeypatch.setattr(perth, "CHECKPOINT_RELPATH", ("no_such_model.pth.tar",))
    out = tmp_path / "out"
    assert main(["synth", str(tiny_model_dir), "--device", "cpu", "--load-format", "dummy", "--text", "Hi.",
                 "--max-new-tokens", "10", "--output-dir", str(out), "--watermark", "on"]) == 0
    assert (out / "0000.wav").exists()
