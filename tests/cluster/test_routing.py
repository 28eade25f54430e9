"""The routing policy alone: affinity, spill past the load bound, two-choice balance, retries."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from higgs_serve.cluster.routing import Router, batch_routing_key, body_key, routing_key


def _router(n=4, capacity=100, **kwargs) -> Router:
    router = Router({f"r{i}": capacity for i in range(n)}, rng=random.Random(0), **kwargs)
    for rid in router.replicas:
        router.set_healthy(rid, True)
    return router


def test_routing_key_from_voice_reference_or_none():
    assert routing_key({"voice": "alice"}) == "voice:alice"
    assert routing_key({"voice": "default"}) is None
    assert routing_key({}) is None
    a = routing_key({"ref_audio": "AAAA"})
    assert a == routing_key({"ref_audio": "AAAA"}) != routing_key({"ref_audio": "BBBB"})
    assert routing_key({"reference_codes": [[1, 2]]}).startswith("reference_codes:")
    # the peers' spellings of the same things
    assert routing_key({"voice": {"id": "alice"}}) == routing_key({"speaker": "alice"}) == "voice:alice"
    clip = [{"audio_path": "/srv/a.wav", "text": "Hi."}]
    assert routing_key({"references": clip}).startswith("references:")
    assert routing_key({"references": clip}) != routing_key({"references": [{"audio_path": "/b"}]})


def test_batch_key_is_the_key_all_items_use_else_the_envelope_key():
    items = [{"input": "a", "voice": "alice"}, {"input": "b", "voice": "alice"}]
    assert batch_routing_key({"items": items}) == "voice:alice"
    assert batch_routing_key({"voice": "bob", "items": items}) == "voice:alice"  # items win
    plain = [{"input": "a"}, {"input": "b", "voice": None}]  # null: the default applies
    assert batch_routing_key({"voice": "bob", "items": plain}) == "voice:bob"
    mixed = [*items, {"input": "c", "voice": "carol"}]
    assert batch_routing_key({"items": mixed}) is None
    assert batch_routing_key({"voice": "bob", "items": mixed}) == "voice:bob"
    assert batch_routing_key({"items": plain}) is None
    assert batch_routing_key({"items": "x", "voice": "bob"}) == "voice:bob"  # the replica's 400


def test_body_key_of_raw_json():
    assert body_key(b'{"voice": "alice"}') == "voice:alice"
    assert body_key(b'{"items": [{"voice": "a"}]}', batch_routing_key) == "voice:a"
    assert body_key(b"not json") is None and body_key(b'["voice"]') is None


def test_a_key_stays_on_its_home_replica():
    router = _router()
    homes = set()
    for _ in range(20):
        decision = router.choose("voice:alice")
        router.dispatched(decision.replica)
        router.finished(decision.replica)
        homes.add(decision.replica)
        assert decision.reason == "affinity"
    assert len(homes) == 1
    # a second router (another front end) agrees without shared state
    assert _router().choose("voice:alice").replica in homes
    assert router.stats.affinity_ratio == 1.0


def test_keys_spread_over_replicas_and_few_move_when_one_leaves():
    router = _router(n=4)
    keys = [f"voice:v{i}" for i in range(400)]
    before = {k: router.choose(k).replica for k in keys}
    assert min(Counter(before.values()).values()) > 60  # ~100 each
    smaller = Router({f"r{i}": 100 for i in range(3)}, rng=random.Random(0))
    for rid in smaller.replicas:
        smaller.set_healthy(rid, True)
    after = {k: smaller.choose(k).replica for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k] == "r3" for k in moved)  # only the keys of the removed replica move


def test_a_busy_home_spills_and_the_spill_becomes_a_second_home():
    router = _router(n=4)
    home = router.choose("voice:hot").replica
    for _ in range(6):  # home: 6 in flight, others 0 -> mean 1.5, bound 1.5*1.5+1 = 3.25
        router.dispatched(home)
    decision = router.choose("voice:hot")
    assert decision.reason == "spill" and decision.replica != home
    assert router.homes["voice:hot"] == [home, decision.replica]
    router.dispatched(decision.replica)
    # the second home now takes the key as affinity while the first stays busy
    again = router.choose("voice:hot")
    assert again.reason == "affinity" and again.replica == decision.replica
    assert router.stats.routed["spill"] == 1


def test_home_within_the_bound_keeps_the_key():
    router = _router(n=2)
    home = router.choose("voice:a").replica
    other = next(r for r in router.replicas if r != home)
    router.dispatched(home)
    router.dispatched(home)
    router.dispatched(other)  # loads 2 and 1: mean 1.5, bound 3.25
    assert router.choose("voice:a").replica == home


def test_zero_shot_two_choices_balance_a_burst():
    router = _router(n=4)
    for _ in range(40):  # a burst: nothing finishes meanwhile
        router.dispatched(router.choose(None).replica)
    loads = [s.in_flight for s in router.replicas.values()]
    assert sum(loads) == 40 and max(loads) - min(loads) <= 3, loads


def test_least_loaded_policy_ignores_keys():
    router = _router(n=2, policy="least-loaded")
    picks = Counter()
    for _ in range(10):
        decision = router.choose("voice:same")
        assert decision.reason == "balance"
        router.dispatched(decision.replica)
        picks[decision.replica] += 1
    assert picks == {"r0": 5, "r1": 5}


def test_reported_load_and_kv_usage_count():
    router = _router(n=2)
    router.report("r0", in_flight=50, kv_usage=0.9)  # fed by another front end
    for _ in range(10):
        assert router.choose(None).replica == "r1"
        router.dispatched("r1")


def test_unhealthy_excluded_and_full_replicas_are_skipped_then_429():
    router = _router(n=3, capacity=2)
    router.set_healthy("r0", False)
    assert all(router.choose(None, exclude=["r1"]).replica == "r2" for _ in range(5))
    for rid in ("r1", "r2"):
        router.dispatched(rid)
        router.dispatched(rid)
    assert router.choose("voice:x") is None and router.choose(None) is None
    assert router.stats.rejected == 2
    router.finished("r2")
    assert router.choose(None).replica == "r2"


def test_unhealthy_home_routes_around_without_losing_the_key():
    router = _router(n=3)
    home = router.choose("voice:a").replica
    router.set_healthy(home, False)
    decision = router.choose("voice:a")
    assert decision.replica != home
    router.set_healthy(home, True)
    assert router.choose("voice:a").replica == home


def test_retry_only_before_the_first_byte():
    router = _router()
    assert router.may_retry(first_byte_sent=False, status=None)      # connection refused
    assert router.may_retry(first_byte_sent=False, status=429)
    assert router.may_retry(first_byte_sent=False, status=503)
    assert not router.may_retry(first_byte_sent=False, status=400)   # the client's error
    assert not router.may_retry(first_byte_sent=True, status=None)   # audio already sent
    assert not router.may_retry(first_byte_sent=True, status=503)


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="policy"):
        Router({"a": 1}, policy="random")
    with pytest.raises(ValueError, match="bound"):
        Router({"a": 1}, load_bound=0.5)
