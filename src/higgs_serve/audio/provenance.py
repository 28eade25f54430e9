"""Signed provenance: a C2PA manifest saying the audio was made by a trained model
(docs/api.md#provenance-c2pa), with c2pa-python.

The operator's signing identity (`--c2pa-cert`, `--c2pa-key`) is read once at start-up,
checked by signing a short file, and kept as a `Provenance`. Then:
- `sign_file(source, dest, response_format)`: a finished file in a format C2PA embeds into
  (wav, mp3, flac), read from one file object and written with the manifest inside to another
  (the server's spooled temporary files, server/last_mile/audio_file.py: no bytes copy in Python). The
  manifest holds one `c2pa.created` action whose digitalSourceType is the IPTC term for trained
  algorithmic media and the generator's name and version, signed over the file's bytes (a hard
  binding: any later change to the audio invalidates it). Other formats (pcm, opus, aac, G.711)
  have no place for a manifest, and files over SIGN_MAX_BYTES are not signed (below): both are
  left as they are (False).
- `claim`: the same statement as JSON for the `X-C2PA-Claim` response header of what carries no
  manifest (streams, whose bytes are not known when the headers leave, and unsigned files).

Memory: c2pa's asset handlers read the whole file into memory while they sign it, 2-3x its size
(measured: benchmarks/results/provenance_cpu.json), whatever the source is. So one file is signed
at a time (one signer, a lock) and only files of at most SIGN_MAX_BYTES: the server's extra memory
for signing stays under about 3 x SIGN_MAX_BYTES however many long files are answered at once.

Certificates: c2pa accepts an X.509 v3 chain in PEM, the signing certificate first, whose
signing certificate is not a CA, has the digitalSignature key usage and an extended key usage
c2pa accepts (emailProtection, documentSigning, ...); a reader trusts it only if its root is
on the reader's trust list (the test builds a throwaway chain: tests/unit/test_provenance.py).

Expiry (docs/api.md#provenance-c2pa): a signing certificate outside its validity period is
refused at start-up (ConfigError, one line); one that expires within EXPIRY_WARNING_S is logged
at start-up, and `seconds_to_expiry` feeds a metric. One that expires while the server runs, or
a signature c2pa refuses for any other reason, leaves that file unsigned (`unsigned_reason` says
why: the response's `X-C2PA-Unsigned` header), never a failed request.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

import numpy as np

from higgs_serve.errors import ConfigError

logger = logging.getLogger(__name__)

# IPTC NewsCodes digital source type for media made by a trained model (what C2PA asks of AI output)
TRAINED_ALGORITHMIC_MEDIA = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
# response_format -> the MIME type c2pa signs it as; the formats with a place for a manifest
SIGNABLE_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac"}
GENERATOR = "higgs-serve"
CLAIM_HEADER = "X-C2PA-Claim"
# The largest file signed (module note: c2pa holds 2-3x the file while signing). 64 MiB: a WAV of
# 23 min at 24 kHz (11 at 48 kHz), a FLAC about twice that, an mp3 of hours; longer long-form
# files are sent unsigned, with the claim header.
SIGN_MAX_BYTES = 64 << 20
EXPIRY_WARNING_S = 30 * 86_400  # a certificate this close to its end is logged at start-up
UNSIGNED_HEADER = "X-C2PA-Unsigned"


def claim_json(version: str) -> str:
    """The manifest's statement as compact JSON (the `X-C2PA-Claim` header's value)."""
    return json.dumps({"claim_generator": f"{GENERATOR}/{version}", "action": "c2pa.created",
                       "digitalSourceType": TRAINED_ALGORITHMIC_MEDIA}, separators=(",", ":"))


@dataclass(frozen=True)
class SigningIdentity:
    cert_chain_pem: bytes  # the signing certificate first, then its issuers
    private_key_pem: bytes
    algorithm: str  # c2pa's name: es256, es384, es512, ps256, ed25519
    tsa_url: str | None = None  # an RFC 3161 timestamp authority, or None
    not_after: datetime | None = None  # the signing certificate's end of validity (UTC)

    @classmethod
    def from_files(cls, cert_path: str | Path, key_path: str | Path, tsa_url: str | None = None,
                   now: datetime | None = None) -> SigningIdentity:
        """Read and check the operator's files (ConfigError naming the flag on any problem,
        a signing certificate outside its validity period included)."""
        chain = _read(cert_path, "--c2pa-cert")
        key = _read(key_path, "--c2pa-key")
        if b"-----BEGIN CERTIFICATE-----" not in chain:
            raise ConfigError(f"--c2pa-cert {cert_path}: not a PEM certificate chain")
        not_after = _check_validity(chain, cert_path, now or datetime.now(timezone.utc))
        return cls(chain, key, _algorithm(key, key_path), tsa_url, not_after)


def _check_validity(chain: bytes, cert_path: str | Path, now: datetime) -> datetime:
    """The signing certificate's notAfter; ConfigError when `now` is outside its validity."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(chain)  # the first certificate: the signer's
    except ValueError as exc:
        raise ConfigError(f"--c2pa-cert {cert_path}: its first certificate cannot be read ({exc})") from exc
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= end:
        raise ConfigError(f"--c2pa-cert {cert_path}: the signing certificate expired on "
                          f"{end:%Y-%m-%d %H:%M} UTC; renew it (or start without --c2pa-cert)")
    if now < start:
        raise ConfigError(f"--c2pa-cert {cert_path}: the signing certificate is valid only from "
                          f"{start:%Y-%m-%d %H:%M} UTC")
    return end


class Provenance:
    """Signs whole files with the operator's identity. Thread-safe (one signer, a lock)."""

    def __init__(self, identity: SigningIdentity, version: str):
        import c2pa  # the native library loads only when provenance is configured

        self._c2pa = c2pa
        self.version = version
        self.not_after = identity.not_after
        self.claim = claim_json(version)
        self._lock = threading.Lock()
        try:
            info = c2pa.C2paSignerInfo(identity.algorithm, identity.cert_chain_pem, identity.private_key_pem,
                                       identity.tsa_url)
            self._signer = c2pa.Signer.from_info(info)
        except (c2pa.C2paError, ValueError, TypeError) as exc:
            raise ConfigError(f"--c2pa-cert/--c2pa-key: c2pa cannot sign with them: {exc}") from exc

    def manifest(self, title: str) -> dict:
        return {
            "claim_generator_info": [{"name": GENERATOR, "version": self.version}],
            "title": title,
            "assertions": [{"label": "c2pa.actions", "data": {"actions": [{
                "action": "c2pa.created", "digitalSourceType": TRAINED_ALGORITHMIC_MEDIA,
                "softwareAgent": {"name": GENERATOR, "version": self.version}}]}}],
        }

    def seconds_to_expiry(self) -> float:
        """Seconds until the signing certificate expires (negative once it has); inf if unknown."""
        if self.not_after is None:
            return float("inf")
        return self.not_after.timestamp() - time.time()

    def warn_if_expiring(self) -> None:
        """Log (start-up) when the certificate ends within EXPIRY_WARNING_S."""
        left_s = self.seconds_to_expiry()
        if left_s < EXPIRY_WARNING_S:
            logger.warning("the C2PA signing certificate expires on %s UTC (in %.1f days): files "
                           "will be sent unsigned from then on; renew --c2pa-cert",
                           f"{self.not_after:%Y-%m-%d %H:%M}", left_s / 86_400)

    @staticmethod
    def can_sign(response_format: str, size_bytes: int) -> bool:
        """Whether a file of this format and size has a place for a manifest (module note)."""
        return response_format in SIGNABLE_FORMATS and size_bytes <= SIGN_MAX_BYTES

    def sign_file(self, source: BinaryIO, dest: BinaryIO, response_format: str) -> str | None:
        """The file read from `source` (at its start) written to `dest` with its manifest
        embedded; blocking (run it off the event loop). Only for what `can_sign` allows.
        Returns None when signed, else why not ("certificate_expired", "signing_failed"):
        then `dest` holds nothing meant to be sent and the file goes unsigned."""
        if response_format not in SIGNABLE_FORMATS:
            raise ValueError(f"{response_format} files have no place for a C2PA manifest")
        if self.seconds_to_expiry() <= 0:
            return "certificate_expired"
        try:
            with self._lock, self._c2pa.Builder(self.manifest(f"speech.{response_format}")) as builder:
                builder.sign(self._signer, SIGNABLE_FORMATS[response_format], source, dest)
        except self._c2pa.C2paError as exc:  # one line, no traceback: the file goes unsigned
            logger.warning("C2PA signing failed, the file is sent unsigned: %s", exc)
            return "certificate_expired" if self.seconds_to_expiry() <= 0 else "signing_failed"
        return None

    def sign(self, data: bytes, response_format: str) -> bytes:
        """Whole file bytes -> the same with the manifest embedded (start-up check, tests)."""
        dest = io.BytesIO()
        unsigned = self.sign_file(io.BytesIO(data), dest, response_format)
        if unsigned is not None:
            raise self._c2pa.C2paError(f"not signed: {unsigned}")
        return dest.getvalue()

    def check(self) -> None:
        """Sign a short WAV once (start-up): a chain c2pa refuses fails here, in one line, not at
        the first request."""
        import soundfile as sf

        buffer = io.BytesIO()
        sf.write(buffer, np.zeros(240, np.int16), 24_000, format="WAV", subtype="PCM_16")
        try:
            self.sign(buffer.getvalue(), "wav")
        except self._c2pa.C2paError as exc:
            raise ConfigError(f"--c2pa-cert/--c2pa-key: c2pa refused to sign with them: {exc}") from exc


def _read(path: str | Path, flag: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from exc


def _algorithm(key_pem: bytes, key_path: str | Path) -> str:
    """The c2pa signing algorithm the private key implies (EC curve size, Ed25519, RSA-PSS)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--c2pa-key {key_path}: not an unencrypted PEM private key ({exc})") from exc
    if isinstance(key, ec.EllipticCurvePrivateKey):
        by_curve = {"secp256r1": "es256", "secp384r1": "es384", "secp521r1": "es512"}
        if key.curve.name not in by_curve:
            raise ConfigError(f"--c2pa-key {key_path}: curve {key.curve.name} is not one C2PA signs with "
                              "(P-256, P-384, P-521)")
        return by_curve[key.curve.name]
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ed25519"
    if isinstance(key, rsa.RSAPrivateKey):
        return "ps256"
    raise ConfigError(f"--c2pa-key {key_path}: a {type(key).__name__} cannot sign C2PA manifests "
                      "(use EC P-256/384/521, Ed25519 or RSA)")
