"""Signed provenance (audio/provenance.py, server/last_mile/audio_file.py): wav, mp3 and flac files carry a
C2PA manifest that c2pa's own reader validates and trusts (given the test root) and that says a
trained model made the audio; the audio itself is unchanged; the server's whole-file path signs
the finished file (header patches applied) from its spooled file, in memory or on disk; formats
without a place for a manifest and files over the size bound stay unsigned and say the claim in
a header; what c2pa refuses fails at start-up in one line."""

from __future__ import annotations

import asyncio
import io

import c2pa
import numpy as np
import pytest
import soundfile as sf

from higgs_serve.audio import provenance as provenance_module
from higgs_serve.audio.encoders import encode_whole
from higgs_serve.audio.formats import float_to_int16
from higgs_serve.audio.provenance import (
    CLAIM_HEADER,
    SIGNABLE_FORMATS,
    TRAINED_ALGORITHMIC_MEDIA,
    Provenance,
    SigningIdentity,
)
from higgs_serve.server.last_mile.audio_file import SPOOL_MEMORY_BYTES, FileSigning, collect_file
from higgs_serve.server.last_mile.audio_out import AudioOut
from higgs_serve.server.last_mile.audio_workers import AudioWorkers
from higgs_serve.errors import ConfigError
from higgs_serve.preflight import load_provenance
from higgs_serve.server.settings import ServerSettings
from support.c2pa_certs import make_chain
from support.speechlike import speechlike


@pytest.fixture(scope="module")
def chain():
    return make_chain()


@pytest.fixture(scope="module")
def provenance(chain, tmp_path_factory):
    cert, key = chain.write(tmp_path_factory.mktemp("c2pa"))
    return load_provenance(ServerSettings(c2pa_cert=cert, c2pa_key=key))


def read_manifest(data: bytes, response_format: str, chain) -> tuple[str, dict]:
    """(validation state, active manifest) as c2pa's reader sees the file."""
    with c2pa.Reader(SIGNABLE_FORMATS[response_format], io.BytesIO(data), context=chain.trust_context()) as reader:
        return reader.get_validation_state(), reader.get_active_manifest()


@pytest.mark.parametrize("response_format", sorted(SIGNABLE_FORMATS))
def test_signed_files_say_a_model_made_them_and_keep_their_audio(provenance, chain, response_format):
    audio = speechlike(2.0, 1)
    plain = encode_whole(float_to_int16(audio), response_format, 24_000)
    signed = provenance.sign(plain, response_format)
    state, manifest = read_manifest(signed, response_format, chain)
    assert state == "Trusted"
    (actions,) = [a["data"]["actions"] for a in manifest["assertions"] if a["label"].startswith("c2pa.actions")]
    assert actions[0]["action"] == "c2pa.created"
    assert actions[0]["digitalSourceType"] == TRAINED_ALGORITHMIC_MEDIA
    assert manifest["claim_generator_info"][0]["name"] == "higgs-serve"
    assert manifest["signature_info"]["common_name"] == "test signer"
    before, _ = sf.read(io.BytesIO(plain), dtype="int16")
    after, rate = sf.read(io.BytesIO(signed), dtype="int16")
    assert rate == 24_000 and np.array_equal(before, after)


def test_a_changed_file_no_longer_validates(provenance, chain):
    signed = bytearray(provenance.sign(encode_whole(float_to_int16(speechlike(1.0, 2)), "wav", 24_000), "wav"))
    signed[60] ^= 0xFF  # one audio byte
    state, _ = read_manifest(bytes(signed), "wav", chain)
    assert state == "Invalid"


def _file(audio: np.ndarray, response_format: str, signing: FileSigning | None, workers: AudioWorkers):
    """The server's whole-file path (server/last_mile/audio_file.py): chunks in, (file bytes, signed,
    claim headers, spilled to disk before signing) out."""
    async def chunks():
        for i in range(0, audio.size, 24_000):
            yield audio[i:i + 24_000]

    spilled = []
    original = provenance_module.Provenance.sign_file

    def sign_file(self, source, dest, fmt):  # records where the unsigned file was
        spilled.append(bool(getattr(source, "_rolled", False)))
        return original(self, source, dest, fmt)

    async def run():
        file = await collect_file(chunks(), AudioOut(response_format, 24_000, 24_000, 1.0, workers,
                                                     seekable=True), signing)
        try:
            return file.read_all(), file.signed, file.claim_headers, file.size_bytes
        finally:
            file.discard()

    provenance_module.Provenance.sign_file = sign_file
    try:
        data, signed, headers, size = asyncio.run(run())
    finally:
        provenance_module.Provenance.sign_file = original
    assert size == len(data)
    return data, signed, headers, spilled


@pytest.fixture
def workers():
    pool = AudioWorkers(2, "higgs-encode")
    yield pool
    pool.shutdown()


@pytest.mark.parametrize("response_format, seconds", [("wav", 2.0), ("wav", 30.0), ("mp3", 3.0), ("flac", 3.0)])
def test_the_whole_file_path_signs_the_finished_file(provenance, chain, workers, response_format, seconds):
    """What is signed is the file as sent: the header patches applied (a WAV's sizes, written
    last), read from the spooled file whether it stayed in memory or went to disk (30 s of WAV
    is past SPOOL_MEMORY_BYTES), and the signed file is what the response carries."""
    audio = speechlike(seconds, 4)
    data, signed, headers, spilled = _file(audio, response_format,
                                           FileSigning(provenance, response_format, workers), workers)
    assert signed and headers == {}
    assert spilled == [seconds * 24_000 * 2 > SPOOL_MEMORY_BYTES]
    state, manifest = read_manifest(data, response_format, chain)
    assert state == "Trusted" and manifest["title"] == f"speech.{response_format}"
    if response_format != "mp3":  # lossless: the very samples of the unsigned file
        assert np.array_equal(sf.read(io.BytesIO(data), dtype="int16")[0], float_to_int16(audio))


def test_files_without_a_manifest_carry_the_claim_header(provenance, workers, monkeypatch):
    """Formats without a place for a manifest, and files past SIGN_MAX_BYTES, are sent as they
    are, with the claim header; a server that does not sign adds nothing."""
    audio = speechlike(1.0, 3)
    for response_format in ("pcm", "opus", "aac", "ulaw"):
        data, signed, headers, spilled = _file(audio, response_format,
                                               FileSigning(provenance, response_format, workers), workers)
        assert not signed and not spilled and headers == {CLAIM_HEADER: provenance.claim}
    plain, *_ = _file(audio, "wav", None, workers)
    monkeypatch.setattr(provenance_module, "SIGN_MAX_BYTES", len(plain) - 1)
    data, signed, headers, spilled = _file(audio, "wav", FileSigning(provenance, "wav", workers), workers)
    assert data == plain and not signed and not spilled and headers == {CLAIM_HEADER: provenance.claim}
    assert _file(audio, "wav", None, workers)[1:3] == (False, {})
    assert "trainedAlgorithmicMedia" in provenance.claim and '"c2pa.created"' in provenance.claim
    with pytest.raises(ValueError, match="no place for a C2PA manifest"):
        provenance.sign(plain, "pcm")


def test_bad_identities_fail_in_one_line(chain, tmp_path):
    cert, key = chain.write(tmp_path)
    with pytest.raises(ConfigError, match="give both or neither"):
        ServerSettings(c2pa_cert=cert)
    with pytest.raises(ConfigError, match="--c2pa-tsa-url timestamps"):
        ServerSettings(c2pa_tsa_url="http://tsa.example")
    with pytest.raises(ConfigError, match="--c2pa-key .*: cannot read it"):
        load_provenance(ServerSettings(c2pa_cert=cert, c2pa_key=tmp_path / "absent.pem"))
    with pytest.raises(ConfigError, match="not a PEM certificate chain"):
        load_provenance(ServerSettings(c2pa_cert=key, c2pa_key=key))
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        load_provenance(ServerSettings(c2pa_cert=cert, c2pa_key=cert))
    ca_signer = make_chain(signer_is_ca=True)  # c2pa signs only with an end-entity certificate
    with pytest.raises(ConfigError, match="c2pa refused to sign with them"):
        Provenance(SigningIdentity(ca_signer.chain_pem, ca_signer.key_pem, "es256"), "test").check()
