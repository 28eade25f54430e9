"""Which replica takes a speech request: voice affinity with a load bound, else two choices.

Pure policy, no framework: the one-host front end (cluster/frontend.py) and the Ray Serve request
router (cluster/ray_app.py) both drive it.

- A request that clones a voice (a registered voice name, or a reference clip / reference codes)
  has a stable key. Its first home is the replica that ranks highest for the key under rendezvous
  hashing, so every router agrees without shared state and only ~1/N of keys move when a replica
  joins or leaves. The home keeps that voice's reference codes and prompt blocks in its prefix
  cache, so the next request with the key is a cache hit there and nowhere else.
- A home much busier than the average (load > bound x mean + 1) is skipped: the less loaded of
  two random replicas takes the request and becomes a further home for the key, so a hot voice
  spreads over just enough replicas instead of all of them.
- Zero-shot requests go to the less loaded of two random replicas (power of two choices).
- Load is what the router itself has in flight on a replica, counted at dispatch (polled figures
  alone are stale within a burst and pile it onto one replica), raised to the replica's own
  reported count when other routers also feed it, plus its KV usage as a fraction of one request.
- A replica at its capacity takes nothing; when every replica is there the caller answers 429.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

POLICIES = ("affinity", "least-loaded")
DEFAULT_LOAD_BOUND = 1.5
# Retryable answers of a replica, all of which come before any audio byte.
RETRYABLE_STATUS = frozenset({429, 503})


@dataclass
class ReplicaLoad:
    """What the router knows about one replica."""

    capacity: int                 # requests it admits (running + waiting); past it the router holds off
    healthy: bool = False         # /ready answered 200 and the process is alive
    in_flight: int = 0            # dispatched by this router, not yet finished
    reported_in_flight: int = 0   # the replica's own count (/metrics), all routers together
    kv_usage: float = 0.0         # used KV blocks / total, from /metrics

    @property
    def load(self) -> float:
        return max(self.in_flight, self.reported_in_flight) + self.kv_usage

    @property
    def full(self) -> bool:
        return max(self.in_flight, self.reported_in_flight) >= self.capacity


@dataclass
class RouteDecision:
    replica: str
    reason: str  # "affinity" (a home took it), "spill" (home too busy), "balance" (no key)


@dataclass
class RouterStats:
    routed: dict[str, int] = field(default_factory=lambda: {"affinity": 0, "spill": 0, "balance": 0})
    retries: int = 0
    rejected: int = 0

    @property
    def affinity_ratio(self) -> float:
        """Keyed requests that went to a home of their key, out of all keyed requests."""
        keyed = self.routed["affinity"] + self.routed["spill"]
        return self.routed["affinity"] / keyed if keyed else 0.0


def routing_key(body: Mapping) -> str | None:
    """The affinity key of a speech request body: the voice (`voice`, vllm-omni's {"id": name}
    or its `speaker` alias), else the reference (`ref_audio`, `reference_codes`, `references`);
    None = zero-shot."""
    voice = body.get("voice")
    if isinstance(voice, Mapping):
        voice = voice.get("id")
    voice = voice or body.get("speaker")
    if isinstance(voice, str) and voice and voice != "default":
        return f"voice:{voice}"
    for field_name in ("ref_audio", "reference_codes", "references"):
        value = body.get(field_name)
        if value:
            data = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            return f"{field_name}:{reference_digest(data.encode())}"
    return None


# A reference longer than twice this is keyed by its length and its two ends only: hashing all of
# a 500 KB clip cost the front end 0.29 ms a request. The key is a cache-affinity hint, never the
# audio used, so two clips that differ only in their middle merely share a home replica.
REFERENCE_SAMPLE_BYTES = 32 * 1024


def reference_digest(data: bytes) -> str:
    if len(data) > 2 * REFERENCE_SAMPLE_BYTES:
        view = memoryview(data)
        digest = hashlib.sha256(len(data).to_bytes(8, "big"))
        digest.update(view[:REFERENCE_SAMPLE_BYTES])
        digest.update(view[-REFERENCE_SAMPLE_BYTES:])
        return digest.hexdigest()[:32]
    return hashlib.sha256(data).hexdigest()[:32]


def batch_routing_key(body: Mapping) -> str | None:
    """The affinity key of a batch (`items` over envelope defaults): the key every item has
    (its own fields over the defaults), else the envelope's own key (the default some items
    use), else None."""
    items = body.get("items")
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        return routing_key(body)
    defaults = {name: value for name, value in body.items() if name != "items"}
    keys = {routing_key({**defaults, **{k: v for k, v in item.items() if v is not None}})
            for item in items}
    return keys.pop() if len(keys) == 1 else routing_key(defaults)


def body_key(body: bytes, key_of: Callable[[Mapping], str | None] = routing_key) -> str | None:
    """`key_of` of a raw JSON request body; None when it is not a JSON object (the replica then
    answers the 400 in its own words)."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None
    return key_of(parsed) if isinstance(parsed, dict) else None


def affinity_rank(key: str, replica: str) -> int:
    """Rendezvous-hash score of `replica` for `key`: the highest-scoring replica is the home."""
    digest = hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Router:
    """Routing state for one front end. Not thread-safe: one event loop drives it."""

    def __init__(self, replicas: Mapping[str, int], *, policy: str = "affinity",
                 load_bound: float = DEFAULT_LOAD_BOUND, rng: random.Random | None = None):
        """replicas: id -> capacity. rng: injected for deterministic tests."""
        if policy not in POLICIES:
            raise ValueError(f"routing policy must be one of {POLICIES}, got {policy!r}")
        if load_bound < 1.0:
            raise ValueError(f"load bound must be >= 1, got {load_bound}")
        self.policy = policy
        self.load_bound = load_bound
        self.rng = rng or random.Random()
        self.replicas = {rid: ReplicaLoad(capacity) for rid, capacity in replicas.items()}
        self.homes: dict[str, list[str]] = {}  # key -> replicas that took it (first = HRW home)
        self.stats = RouterStats()

    # ------------------------------------------------------------ state from outside
    def set_replicas(self, replicas: Mapping[str, int]) -> None:
        """Replace the replica set (Ray: replicas come and go); known replicas keep their state."""
        self.replicas = {rid: self.replicas.get(rid) or ReplicaLoad(capacity)
                         for rid, capacity in replicas.items()}
        for key in list(self.homes):
            self.homes[key] = [r for r in self.homes[key] if r in self.replicas]

    def set_healthy(self, replica: str, healthy: bool) -> None:
        self.replicas[replica].healthy = healthy

    def report(self, replica: str, *, in_flight: int, kv_usage: float) -> None:
        """Figures polled from the replica's /metrics."""
        state = self.replicas[replica]
        state.reported_in_flight = in_flight
        state.kv_usage = min(max(kv_usage, 0.0), 1.0)

    def dispatched(self, replica: str) -> None:
        self.replicas[replica].in_flight += 1

    def finished(self, replica: str) -> None:
        state = self.replicas.get(replica)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1

    # ------------------------------------------------------------ the decision
    def choose(self, key: str | None, exclude: Iterable[str] = ()) -> RouteDecision | None:
        """The replica for a request with affinity `key` (None: zero-shot), skipping `exclude`
        (replicas already tried). None when no healthy replica has room: answer 429."""
        excluded = set(exclude)
        open_ = [r for r, s in self.replicas.items() if s.healthy and not s.full and r not in excluded]
        if not open_:
            self.stats.rejected += 1
            return None
        if key is None or self.policy == "least-loaded":
            decision = RouteDecision(self._two_choices(open_), "balance")
        else:
            decision = self._by_affinity(key, open_)
        self.stats.routed[decision.reason] += 1
        return decision

    def _by_affinity(self, key: str, open_: list[str]) -> RouteDecision:
        homes = self.homes.get(key)
        if homes is None:  # first sight of the key: its rendezvous-hash home among all replicas
            homes = self.homes[key] = [max(self.replicas, key=lambda r: affinity_rank(key, r))]
        bound = self.load_bound * self._mean_load() + 1.0
        usable = [r for r in homes if r in open_ and self.replicas[r].load <= bound]
        if usable:
            return RouteDecision(min(usable, key=lambda r: self.replicas[r].load), "affinity")
        replica = self._two_choices(open_)
        if replica not in homes:
            homes.append(replica)
        return RouteDecision(replica, "spill")

    def _two_choices(self, candidates: list[str]) -> str:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self.rng.sample(candidates, 2)
        return a if self.replicas[a].load <= self.replicas[b].load else b

    def _mean_load(self) -> float:
        healthy = [s.load for s in self.replicas.values() if s.healthy]
        return sum(healthy) / len(healthy) if healthy else 0.0

    # ------------------------------------------------------------ retries
    def may_retry(self, *, first_byte_sent: bool, status: int | None) -> bool:
        """Whether a failed attempt may go to another replica: only before the first response
        byte reached the client, and only for a connection failure (status None) or a replica
        answering 429/503 (full, warming up, dead). Anything later is the client's to see."""
        if first_byte_sent:
            return False
        return status is None or status in RETRYABLE_STATUS

    def count_retry(self) -> None:
        self.stats.retries += 1
