"""Issue 2: `higgs-serve synth` on a tiny checkpoint writes WAV + NPZ per text.

One real subprocess run (the installed entry point, ~3 s with its imports) and the same command
again through `cli.main` in-process; bad inputs go through `cli.main` too, since they must fail
before any model is loaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from higgs_serve.cli import main
from higgs_serve.model.delay_pattern import rows_to_codec_frames

FRAMES = 30
TEXTS = ("Hello there.", "The cat sat on the mat.")


def _synth_args(model_dir: Path, out_dir: Path) -> list[str]:
    args = ["--log-level", "WARNING", "synth", "--model", str(model_dir), "--output-dir", str(out_dir),
            "--device", "cpu", "--seed", "1", "--max-new-tokens", str(FRAMES), "--stream"]
    for text in TEXTS:
        args += ["--text", text]
    return args


@pytest.fixture(scope="module")
def two_runs(tiny_model_dir, tmp_path_factory):
    """The same command twice: once as a real subprocess, once through `main` in-process."""
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    proc = subprocess.run([sys.executable, "-m", "higgs_serve.cli", *_synth_args(tiny_model_dir, first)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert main(_synth_args(tiny_model_dir, second)) == 0
    return [(first, proc.stdout), (second, None)]


def test_outputs_have_the_documented_format(two_runs):
    out_dir, stdout = two_runs[0]
    for i in range(len(TEXTS)):
        wav, npz = out_dir / f"{i:04d}.wav", out_dir / f"{i:04d}.npz"
        info = sf.info(wav)
        assert (info.samplerate, info.channels, info.subtype, info.format) == (24000, 1, "PCM_16", "WAV")
        with np.load(npz) as data:
            rows, frames, audio = data["rows"], data["frames"], data["audio"]
        assert rows.dtype == frames.dtype == np.int64 and audio.dtype == np.float32
        assert rows.ndim == 2 and rows.shape[1] == 8 and frames.shape == (FRAMES, 8)
        assert audio.shape == (FRAMES * 960,) and info.frames == FRAMES * 960
        np.testing.assert_array_equal(rows_to_codec_frames(rows, finished_naturally=False), frames)
        samples, _ = sf.read(wav, dtype="float32")
        # the WAV is the audio quantised to 16 bits (clipped to full scale)
        np.testing.assert_allclose(samples, np.clip(audio, -1.0, 1.0), atol=1.0 / 32767)
        assert f"{i:04d}: {FRAMES} frames" in stdout and "stream ok" in stdout


def test_same_seed_gives_identical_codes(two_runs):
    (a, _), (b, _) = two_runs
    for i in range(len(TEXTS)):
        with np.load(a / f"{i:04d}.npz") as x, np.load(b / f"{i:04d}.npz") as y:
            np.testing.assert_array_equal(x["rows"], y["rows"])
            np.testing.assert_array_equal(x["frames"], y["frames"])
            # Codes are bit-identical. Audio agrees to float rounding: Stage 1 stacks whichever
            # same-length windows are queued together, and a batched convolution may round
            # differently from a batch of one (documented in the README).
            np.testing.assert_allclose(x["audio"], y["audio"], rtol=0, atol=1e-5 * np.abs(x["audio"]).max())
    with np.load(a / "0000.npz") as x, np.load(a / "0001.npz") as y:
        assert not np.array_equal(x["frames"], y["frames"])  # different texts, different codes


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--text", ""], "text must not be empty"),
        (["--text", "hi", "--temperature", "-1"], "temperature"),
    ],
)
def test_bad_request_exits_2_with_a_message(tiny_model_dir, tmp_path, capsys, extra, message):
    code = main(["--log-level", "WARNING", "synth", "--model", str(tiny_model_dir),
                 "--output-dir", str(tmp_path / "out"), "--device", "cpu", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


def test_missing_model_dir_exits_2(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    code = main(["--log-level", "WARNING", "synth", "--model", str(missing), "--text", "hi",
                 "--output-dir", str(tmp_path / "out"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and str(missing) in err and "Traceback" not in err
