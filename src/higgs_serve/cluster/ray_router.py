"""Ray Serve request router running cluster/routing.py's policy for the engine deployment."""

from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from higgs_serve.cluster.routing import DEFAULT_LOAD_BOUND, Router


class VoiceAffinityRouter(FIFOMixin, RequestRouter):
    """Ray Serve request router running cluster/routing.py's policy.

    The key is the request's multiplexed model id (set by the ingress); the load of a replica is
    what this router has in flight there (counted when a request is sent, released when it
    completes), raised to Ray's probed queue length (all callers), plus the KV usage the replica
    reports in its routing stats. Kwargs (request_router_kwargs): policy, load_bound.
    """

    def initialize_state(self, policy: str = "affinity", load_bound: float = DEFAULT_LOAD_BOUND,
                         **unknown: Any) -> None:
        if unknown:
            raise ValueError(f"VoiceAffinityRouter: unknown request_router_kwargs {sorted(unknown)}")
        self._policy = Router({}, policy=policy, load_bound=load_bound)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._policy.set_replicas({r.replica_id.unique_id: r.max_ongoing_requests for r in replicas})
        for replica in replicas:
            self._policy.set_healthy(replica.replica_id.unique_id, True)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        for rid, replica in by_id.items():
            if rid not in self._policy.replicas:
                continue
            # Other callers' requests show in Ray's probed queue length; the replica's own
            # routing stats arrive too rarely for counts (a stale burst would pin traffic
            # elsewhere), so only its KV usage is taken from them.
            stats = replica.routing_stats or {}
            queued = self._replica_queue_len_cache.get(replica.replica_id) or 0
            self._policy.report(rid, in_flight=queued, kv_usage=float(stats.get("kv_usage", 0.0)))
        key = None
        if pending_request is not None:
            key = pending_request.metadata.multiplexed_model_id or None
        others = [rid for rid in self._policy.replicas if rid not in by_id]
        decision = self._policy.choose(key, exclude=others)
        if decision is None:  # all full: let Ray back off and ask again
            return [candidate_replicas]
        chosen = by_id[decision.replica]
        return [[chosen], [r for r in candidate_replicas if r is not chosen]]

    def on_send_request(self, replica_id) -> None:
        # called for every request sent (on_request_routed is not, without strict rejection)
        super().on_send_request(replica_id)
        self._policy.dispatched(replica_id.unique_id)

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self._policy.finished(replica_id.unique_id)
