"""Issue 45: every command and code block in the README and docs/ runs here, or is marked as one
that cannot run in CI (docs/contributing.md#examples-that-cannot-rot).

The runnable blocks of each page run in order in a fresh folder, against one real server on the
tiny model (its own free port, voices folder and local-media folder). What the test changes in a
block, and nothing else: `localhost:8000` / `127.0.0.1:8000` become that server, `/srv/voices`
its local-media folder, and curl fails on an HTTP error (`--fail-with-body`). The server caps each
request at 50 frames, so the tiny model's noise stays short (the long-form page's examples run a
second time without that cap, as a reader runs them). Every audio file a block writes must read
to one length in every reader (issue 50). Marked blocks still have their
`higgs-serve` lines parsed by the real argument parser, so a renamed flag fails here too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import soundfile as sf

from higgs_serve import cli
from support.doc_blocks import LITERAL_LANGS, MARKS, REPO, Block, argv_words, blocks, doc_files, higgs_serve_commands
from support.server_process import free_port, stop, wait_ready

PAGES = doc_files()
AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".opus", ".aac"}
HEADERLESS_SUFFIXES = {".pcm", ".ulaw", ".alaw"}
# a header's length against the decoded one: Ogg/Opus counts its 6.5 ms pre-skip, a streamed mp3's
# length is estimated from its bit rate (a 24 ms frame at 24 kHz)
LENGTH_TOLERANCE_S = 0.025
BASH_PRELUDE = "set -eo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
# the test server's cap (frames of 40 ms) on every request, as a profile key
SHORT_REQUESTS = '{"0": {"default_sampling_params": {"max_tokens": 50}}}'


def _higgs_serve() -> list[str]:
    script = shutil.which("higgs-serve")
    return [script] if script else [sys.executable, "-m", "higgs_serve.cli"]


def _all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def _is_first_screen(block: Block) -> bool:
    """The README's first block: test_readme_ci.py and test_cli_examples.py run it (install, main job, tests)."""
    return block.path == REPO / "README.md" and block.line == blocks(block.path)[0].line


# ---------------------------------------------------------------------------------------- the rules
def test_every_block_is_a_known_kind_and_every_mark_says_why():
    problems = []
    for block in _all_blocks():
        if block.lang not in LITERAL_LANGS and not block.is_command:
            problems.append(f"{block.where}: language {block.lang!r} is neither run nor a literal")
        if block.mark_text is not None and block.mark not in MARKS:
            problems.append(f"{block.where}: unknown mark {block.mark_text}")
        if block.mark in MARKS and MARKS[block.mark] and not block.why:
            problems.append(f"{block.where}: `{block.mark}` needs its reason in parentheses")
        if block.mark is not None and not block.is_command:
            problems.append(f"{block.where}: a mark on a {block.lang or 'literal'} block")
        if not block.is_command and block.body.lstrip().startswith(("higgs-serve ", "curl ", "pip ", "python")):
            problems.append(f"{block.where}: a command in a literal block (fence it as bash)")
        if block.mark == "covered" and not re.search(r"tests/\S+\.py", block.why or ""):
            problems.append(f"{block.where}: `covered` names the test that runs it")
        elif block.mark == "covered" and not (REPO / re.search(r"tests/\S+\.py", block.why).group(0)).is_file():
            problems.append(f"{block.where}: {block.why}: no such test file")
        if block.mark == "serves" and any(argv_words(c)[1] != "serve" for c in higgs_serve_commands(block.body)):
            problems.append(f"{block.where}: a `serves` block holds only `higgs-serve serve` lines")
    assert not problems, "\n".join(problems)


def test_every_documented_higgs_serve_line_parses():
    """Run or not, every `higgs-serve ...` line of a bash block is accepted by the real parser (a usage
    line without its `[--optional ...]` parts)."""
    parser = cli.build_parser()
    failures = []
    for block in _all_blocks():
        if block.lang != "bash" or block.mark == "installs":
            continue
        for command in higgs_serve_commands(block.body):
            try:
                parser.parse_args(argv_words(command)[1:])
            except SystemExit:
                failures.append(f"{block.where}: {command}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------- running them
@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    """One tiny server for every page, and the files the examples read (me.wav, narrator.wav in
    the local-media folder; speech.mp3, speech.ulaw, raw.pcm and out/0000.wav made by the server)."""
    root = tmp_path_factory.mktemp("docs_examples")
    media, voices, files = root / "media", root / "voices", root / "files"
    for folder in (media, voices, files / "out"):
        folder.mkdir(parents=True)
    t = np.arange(24000) / 24000
    clip = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    for name in ("me.wav", "narrator.wav"):
        sf.write(files / name, clip, 24000)
        sf.write(media / name, clip, 24000)
    port, url, proc = _start_server(tiny_model_dir, root, ["--voices-dir", str(voices), "--allowed-local-media-path",
                                                          str(media), "--stage-overrides", SHORT_REQUESTS])
    try:
        for name, body in [("speech.mp3", {"response_format": "mp3", "stream": False}),
                           ("speech.ulaw", {"response_format": "ulaw"}), ("raw.pcm", {"response_format": "pcm"}),
                           ("out/0000.wav", {"stream": False})]:
            response = httpx.post(f"{url}/v1/audio/speech", json={"input": "Made for the examples.", **body},
                                  timeout=120)
            assert response.status_code == 200, response.text
            (files / name).write_bytes(response.content)
        yield {"url": url, "port": port, "media": media, "files": files, "model": tiny_model_dir}
    finally:
        stop(proc)


def _start_server(model: Path, cwd: Path, args: list[str]) -> tuple[int, str, subprocess.Popen]:
    """(port, url, process) of a ready tiny server on a free port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(_higgs_serve() + ["--log-level", "WARNING", "serve", str(model), "--port", str(port),
                                              "--device", "cpu", *args],
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(proc, url)
    except BaseException:
        stop(proc)
        raise
    return port, url, proc


def _page_dir(tmp_path: Path, served: dict, page: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(served["files"], work)
    makes_its_model = any("make-tiny-model ./tiny-model" in b.body for b in blocks(page)
                          if b.mark is None and not _is_first_screen(b))
    if not makes_its_model:
        (work / "tiny-model").symlink_to(served["model"], target_is_directory=True)
    return work


def _as_run(block: Block, served: dict) -> str:
    text = block.body.replace("localhost:8000", f"127.0.0.1:{served['port']}")
    text = text.replace("127.0.0.1:8000", f"127.0.0.1:{served['port']}")
    return text.replace("/srv/voices", str(served["media"]))


def _audio_files(work: Path) -> dict[Path, float]:
    return {p: p.stat().st_mtime for p in work.rglob("*")
            if p.is_file() and p.suffix in AUDIO_SUFFIXES | HEADERLESS_SUFFIXES and "tiny-model" not in p.parts}


def _check_audio(path: Path) -> None:
    """A file the example wrote holds audio: raw audio is non-empty; a container decodes to
    samples, and every reader tells the same length (issue 50): the header's length in PyAV
    (FFmpeg's libraries), soundfile (libsndfile; it has no AAC) and, for WAV, the standard
    library's `wave`, each within a codec frame of what FFmpeg decodes."""
    assert path.stat().st_size > 0, f"{path.name} is empty"
    if path.suffix in HEADERLESS_SUFFIXES:
        assert path.stat().st_size % (2 if path.suffix == ".pcm" else 1) == 0, f"{path.name}: odd byte count"
        return
    with av.open(str(path)) as container:
        rate_hz = container.streams.audio[0].rate
        samples = sum(frame.samples for frame in container.decode(audio=0))
        header_s = None if container.duration is None else container.duration / 1e6
    assert samples > 0, f"{path.name} decodes to no audio"
    decoded_s = samples / rate_hz
    said = {"PyAV": header_s}
    if path.suffix != ".aac":
        said["soundfile"] = sf.info(str(path)).duration
    if path.suffix == ".wav":
        with wave.open(str(path)) as handle:
            said["wave"] = handle.getnframes() / handle.getframerate()
    wrong = {reader: length_s for reader, length_s in said.items()
             if length_s is None or abs(length_s - decoded_s) > LENGTH_TOLERANCE_S}
    assert not wrong, f"{path.name} decodes to {decoded_s:.3f} s, but its header says {wrong}"


def _run_block(block: Block, work: Path, served: dict) -> str:
    """Run it; every audio file it wrote must read right (_check_audio). Its stdout."""
    text = _as_run(block, served)
    if block.lang == "bash":
        argv = ["bash", "-c", BASH_PRELUDE + text]
    else:
        argv = [sys.executable, "-c", text]
    before = _audio_files(work)
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{block.where} failed ({proc.returncode}):\n{text}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    for path, mtime in _audio_files(work).items():
        if before.get(path) != mtime:
            _check_audio(path)
    return proc.stdout


def _serve_block(block: Block, work: Path) -> None:
    """A `serves` block: each `higgs-serve serve` line on a free port must become ready; then stopped."""
    for command in higgs_serve_commands(block.body):
        words = argv_words(command)
        port = free_port()
        if "--port" in words:
            words[words.index("--port") + 1] = str(port)
        else:
            words += ["--port", str(port)]
        proc = subprocess.Popen(_higgs_serve() + words[1:], cwd=work, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_ready(proc, f"http://127.0.0.1:{port}", timeout_s=180)
        finally:
            stop(proc)


def _forget_voices(url: str) -> None:
    """Each page starts with no registered voice, as a reader's fresh server would."""
    for name in httpx.get(f"{url}/v1/audio/voices", timeout=30).json()["voices"]:
        httpx.delete(f"{url}/v1/audio/voices/{name}", timeout=30).raise_for_status()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_pages_examples_run(page: Path, served, tmp_path):
    work = _page_dir(tmp_path, served, page)
    _forget_voices(served["url"])
    ran = 0
    for block in blocks(page):
        if not block.is_command or _is_first_screen(block):
            continue
        if block.mark == "serves":
            _serve_block(block, work)
        elif block.mark is None:
            _run_block(block, work, served)
        else:
            continue
        ran += 1
    if ran == 0:
        pytest.skip(f"{page.name} has no runnable block")


def test_the_long_form_page_runs_as_a_reader_runs_it(tmp_path, tiny_model_dir):
    """Issue 50: the long-form page's REST and SSE examples against a server without this
    module's 50-frame cap, as a reader's: the file lasts what its own max_new_tokens allows per
    segment (not minutes of the tiny model's noise), and the SSE count prints the number of
    segments the file's X-Segments header lists."""
    rest, sse = [b for b in blocks(REPO / "docs" / "long-form.md") if b.is_command and b.mark is None][:2]
    port, _, proc = _start_server(tiny_model_dir, tmp_path, ["--voices-dir", str(tmp_path / "voices")])
    try:
        served = {"port": port, "media": tmp_path}
        _run_block(rest, tmp_path, served)
        headers = (tmp_path / "long_headers.txt").read_text().splitlines()
        (segments,) = [json.loads(line.split(":", 1)[1]) for line in headers
                       if line.lower().startswith("x-segments:")]
        max_new_tokens = json.loads((tmp_path / "long.json").read_text())["max_new_tokens"]
        assert len(segments) > 1
        assert sf.info(str(tmp_path / "long.wav")).duration <= len(segments) * max_new_tokens * 0.04 + 0.05
        assert _run_block(sse, tmp_path, served).strip() == str(len(segments))
    finally:
        stop(proc)
