"""Detection says only our words (issue 50). An mp3 that libsndfile's libmpg123 complains about on
stderr while reading it block by block (its "part2_3_length ... too large" on the server's own
mp3s, which every decoder reads to the same samples) is decoded with FFmpeg's decoder, whose log
PyAV leaves off: neither `higgs-serve detect` nor the server prints a line of a decoder library's
own. Headerless samples sent without `format` get a refusal that says `format`."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import numpy as np
import pytest

from higgs_serve.audio.encoders import encode_whole
from support.decoders import av_encode

PATH = "/v1/audio/watermark/detect"
# how audio/decode.py read an mp3 before: soundfile, block by block
SOUNDFILE_BLOCKS = """import sys, soundfile as sf
with sf.SoundFile(sys.argv[1]) as handle:
    while handle.read(65536, dtype="float32").shape[0]:
        pass"""


@pytest.fixture(scope="module")
def noise_mp3(tmp_path_factory):
    """4 s of seeded noise in the server's mp3 file framing (stream: false)."""
    noise = np.random.default_rng(1).standard_normal(4 * 24000) * 3000
    path = tmp_path_factory.mktemp("detect") / "speech.mp3"
    path.write_bytes(encode_whole(noise.astype(np.int16), "mp3", 24000))
    return path


def test_the_file_is_one_libmpg123_complains_about(noise_mp3):
    """The premise: read as decoding used to, libmpg123 writes its own line to stderr (a
    subprocess: the line goes to file descriptor 2, past Python)."""
    done = subprocess.run([sys.executable, "-c", SOUNDFILE_BLOCKS, str(noise_mp3)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "part2_3_length" in done.stderr


def test_higgs_serve_detect_prints_only_its_answer(noise_mp3):
    done = subprocess.run([sys.executable, "-m", "higgs_serve.cli", "detect", str(noise_mp3)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    # noise is not speech: the verdict is inconclusive, on one line, with nothing of libmpg123's
    assert re.fullmatch(rf"{re.escape(str(noise_mp3))}: inconclusive: [^\n]* \(score 0\.\d+\)\n", done.stdout)


def test_the_server_says_nothing_of_a_decoders_own(fake_server, noise_mp3, capfd):
    """The threaded server runs in this process: its file descriptors are the ones capfd reads."""
    capfd.readouterr()
    got = httpx.post(f"{fake_server.url}{PATH}", files={"file": ("speech.mp3", noise_mp3.read_bytes())},
                     timeout=60)
    assert got.status_code == 200 and got.json()["detected"] is False
    out, err = capfd.readouterr()
    assert "mpg123" not in out + err and "part2_3_length" not in out + err


def test_headerless_samples_without_format_are_told_about_format(fake_server):
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(48_000) / 24_000)).astype(np.float32)
    ulaw = av_encode(tone, 24_000, "pcm_mulaw", "mulaw", out_rate_hz=8000)
    got = httpx.post(f"{fake_server.url}{PATH}", files={"file": ("call.ulaw", ulaw)}, timeout=60)
    assert got.status_code == 400
    error = got.json()["error"]
    assert error["param"] == "file" and "need format (pcm, ulaw or alaw)" in error["message"]


def test_the_cli_names_its_flags_not_the_endpoints_fields(tmp_path):
    """Issue 61: `higgs-serve detect README.md` told of the endpoint's `format` field; the CLI's
    errors name its flags (and only them)."""
    text = tmp_path / "README.md"
    text.write_text("# not audio\n" * 50)
    done = subprocess.run([sys.executable, "-m", "higgs_serve.cli", "detect", str(text)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert "need --format (pcm, ulaw or alaw)" in done.stderr, done.stderr
    assert "need format" not in done.stderr and "sample_rate" not in done.stderr
