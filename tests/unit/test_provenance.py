"""Signed provenance (audio/provenance.py): wav, mp3 and flac files carry a C2PA manifest that
c2pa's own reader validates and trusts (given the test root) and that says a trained model made
the audio; the audio itself is unchanged; what c2pa refuses fails at start-up in one line."""

from __future__ import annotations

import io

import c2pa
import numpy as np
import pytest
import soundfile as sf

from higgs_serve.audio import formats
from higgs_serve.audio.provenance import (
    SIGNABLE_FORMATS,
    TRAINED_ALGORITHMIC_MEDIA,
    Provenance,
    SigningIdentity,
)
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
    plain = formats.encode_audio(audio, response_format, 24_000)
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
    signed = bytearray(provenance.sign(formats.encode_audio(speechlike(1.0, 2), "wav", 24_000), "wav"))
    signed[60] ^= 0xFF  # one audio byte
    state, _ = read_manifest(bytes(signed), "wav", chain)
    assert state == "Invalid"


def test_formats_without_a_place_for_a_manifest_pass_unchanged(provenance):
    audio = speechlike(1.0, 3)
    for response_format in ("pcm", "opus"):
        data = formats.encode_audio(audio, response_format, 24_000)
        assert provenance.sign(data, response_format) == data
    assert "trainedAlgorithmicMedia" in provenance.claim and '"c2pa.created"' in provenance.claim


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
