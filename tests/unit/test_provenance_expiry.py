"""The C2PA signing certificate's validity (issue 52): an expired (or not yet valid) certificate
is refused at start-up in one line; one close to its end is logged and its time to expiry is a
metric; one that expires while the server runs leaves files unsigned with the claim header and
`X-C2PA-Unsigned: certificate_expired` (no 500, no traceback), as does any signature c2pa refuses."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time

import c2pa
import pytest

from higgs_serve.audio.provenance import CLAIM_HEADER, UNSIGNED_HEADER
from higgs_serve.errors import ConfigError
from higgs_serve.metrics import ServerMetrics
from higgs_serve.preflight import load_provenance
from higgs_serve.server.last_mile.audio_file import FileSigning, collect_file
from higgs_serve.server.last_mile.audio_out import AudioOut
from higgs_serve.server.last_mile.audio_workers import AudioWorkers
from higgs_serve.server.settings import ServerSettings
from support.c2pa_certs import make_chain
from support.speechlike import speechlike


def _load(tmp_path, **validity):
    cert, key = make_chain(**validity).write(tmp_path)
    return load_provenance(ServerSettings(c2pa_cert=cert, c2pa_key=key))


def test_an_expired_or_future_certificate_is_refused_at_start_up(tmp_path):
    with pytest.raises(ConfigError, match=r"the signing certificate expired on \d{4}-\d\d-\d\d") as expired:
        _load(tmp_path, valid_from_days=-10, valid_until_days=-1)
    assert "\n" not in str(expired.value)
    with pytest.raises(ConfigError, match="is valid only from"):
        _load(tmp_path, valid_from_days=1, valid_until_days=10)


def test_the_cli_refuses_an_expired_certificate_in_one_line(tmp_path):
    cert, key = make_chain(valid_from_days=-10, valid_until_days=-1).write(tmp_path)
    run = subprocess.run([sys.executable, "-m", "higgs_serve.cli", "serve", str(tmp_path / "no-model"),
                          "--c2pa-cert", str(cert), "--c2pa-key", str(key), "--device", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2  # checked before the model is looked for: the path need not exist
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("higgs-serve: error: --c2pa-cert ")
    assert "the signing certificate expired on" in run.stderr


def test_a_certificate_close_to_its_end_is_logged_and_measured(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="higgs_serve.audio.provenance"):
        provenance = _load(tmp_path, valid_until_days=3)
    assert any("expires on" in r.getMessage() and "renew --c2pa-cert" in r.getMessage() for r in caplog.records)
    metrics = ServerMetrics(engine_stats=dict, in_flight=lambda: 0)
    metrics.watch_certificate(provenance.seconds_to_expiry)
    line = next(l for l in metrics.render().decode().splitlines()
                if l.startswith("higgs_serve_c2pa_certificate_expiry_seconds "))
    assert 2.9 * 86_400 < float(line.split()[1]) < 3.1 * 86_400


def _signed_file(provenance, workers):
    async def run():
        out = AudioOut("wav", 24_000, 24_000, 1.0, workers, seekable=True)
        file = await collect_file(_chunks(), out, FileSigning(provenance, "wav", workers))
        try:
            return file.read_all(), file.signed, file.claim_headers
        finally:
            file.discard()

    async def _chunks():
        yield speechlike(1.0, 2)

    return asyncio.run(run())


def test_expiring_while_serving_sends_unsigned_audio_with_a_header(tmp_path, monkeypatch, caplog):
    provenance = _load(tmp_path)
    workers = AudioWorkers(1, "higgs-encode")
    try:
        data, signed, headers = _signed_file(provenance, workers)
        assert signed and headers == {}
        monkeypatch.setattr(provenance, "not_after", provenance.not_after.fromtimestamp(time.time() - 1,
                                                                                       provenance.not_after.tzinfo))
        data, signed, headers = _signed_file(provenance, workers)
        assert not signed and data[:4] == b"RIFF"
        assert headers == {CLAIM_HEADER: provenance.claim, UNSIGNED_HEADER: "certificate_expired"}
        assert provenance.seconds_to_expiry() < 0

        def refuse(*args, **kwargs):
            raise c2pa.C2paError("the signer refused")

        monkeypatch.setattr(provenance, "not_after", None)
        monkeypatch.setattr(provenance._c2pa, "Builder", refuse)
        with caplog.at_level(logging.WARNING):
            data, signed, headers = _signed_file(provenance, workers)
        assert not signed and data[:4] == b"RIFF" and headers[UNSIGNED_HEADER] == "signing_failed"
        assert not any(r.exc_info for r in caplog.records)  # one line, no traceback
    finally:
        workers.shutdown()
