"""The watermark through the data-parallel front end (conftest.py's two tiny-model CPU replicas):
the replicas mark what they generate (the mark is on by default and `--watermark` is passed to
them), and the front end answers POST /v1/audio/watermark/detect itself (its control plane, a
CPU detector of its own), after the relay's key and body-limit checks (tests/cluster/test_relay.py
has the limit)."""

from __future__ import annotations

from support.cluster_e2e import assert_marked_and_detected


def test_audio_through_the_front_end_is_marked_and_detected_there(cluster):
    _, http, _ = cluster
    assert_marked_and_detected(http)
