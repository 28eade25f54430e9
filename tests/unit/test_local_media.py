"""server/plan/local_media.py: which `ref_audio` values are local files, and the directory rule."""

from __future__ import annotations

import os
import threading

import pytest

from higgs_serve.errors import InvalidRequestError
from higgs_serve.server.plan.local_media import is_local_reference, read_local_reference


@pytest.mark.parametrize("value, local", [
    ("file:///srv/a.wav", True), ("/srv/refs/a", True), ("./a.wav", True), ("male-voice.wav", True),
    ("docs/_static/audio/male-voice.wav", True), ("UklGRiQAAABXQVZF", False),
    ("//uQxAAAAAAAAAAAAAAAAAAA", False),  # base64 of an MP3 frame starts with '//'
    ("data:audio/wav;base64,UklG", False), ("https://host/a.wav", False), ("%%%junk%%%", False),
])
def test_local_reference_detection(value, local):
    assert is_local_reference(value) is local


@pytest.fixture
def media(tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "a.wav").write_bytes(b"RIFF1234")
    (media / "dir.wav").mkdir()
    (tmp_path / "secret.wav").write_bytes(b"secret")
    (media / "link.wav").symlink_to(tmp_path / "secret.wav")
    (media / "inner_link.wav").symlink_to(media / "a.wav")
    return media


def test_reads_inside_and_follows_symlinks_that_stay_inside(media):
    assert read_local_reference(str(media / "a.wav"), media, 100, "ref_audio") == b"RIFF1234"
    assert read_local_reference((media / "inner_link.wav").as_uri(), media, 100, "x") == b"RIFF1234"


def test_relative_paths_are_from_the_working_directory(media, monkeypatch):
    monkeypatch.chdir(media.parent)
    assert read_local_reference("media/a.wav", media, 100, "ref_audio") == b"RIFF1234"


@pytest.mark.parametrize("name, words", [
    ("link.wav", "outside"), ("../secret.wav", "outside"), ("missing.wav", "no such file"),
    ("dir.wav", "not a regular file"),
])
def test_refusals(media, name, words):
    with pytest.raises(InvalidRequestError, match=words) as error:
        read_local_reference(f"{media}/{name}", media, 100, "references[0].audio_path")
    assert error.value.param == "references[0].audio_path"


def test_size_limit_and_missing_flag_and_remote_file_urls(media):
    with pytest.raises(InvalidRequestError, match="limit is 4"):
        read_local_reference(str(media / "a.wav"), media, 4, "ref_audio")
    with pytest.raises(InvalidRequestError, match="--allowed-local-media-path"):
        read_local_reference(str(media / "a.wav"), None, 100, "ref_audio")
    with pytest.raises(InvalidRequestError, match="this host"):
        read_local_reference(f"file://other{media}/a.wav", media, 100, "ref_audio")
    assert os.path.exists(media / "a.wav")


def test_a_fifo_is_refused_at_once_without_blocking(media):
    """Issue 40 item 1: opening a FIFO for reading blocks until a writer comes, so eight requests
    naming one pinned eight threads forever; the open is non-blocking and the type checked first."""
    os.mkfifo(media / "pipe.wav")
    result: list[BaseException] = []

    def read() -> None:
        try:
            read_local_reference(str(media / "pipe.wav"), media, 100, "ref_audio")
        except BaseException as error:  # noqa: BLE001: handed to the test thread
            result.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=2)
    if reader.is_alive():  # unblock the stuck open() so the thread can end, then fail
        os.close(os.open(media / "pipe.wav", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO blocked")
    assert isinstance(result[0], InvalidRequestError) and "not a regular file" in str(result[0])
    assert result[0].param == "ref_audio"


def test_device_files_are_refused(media):
    (media / "zero.wav").symlink_to("/dev/zero")  # resolved outside: refused by the directory rule
    with pytest.raises(InvalidRequestError, match="outside"):
        read_local_reference(str(media / "zero.wav"), media, 100, "ref_audio")
