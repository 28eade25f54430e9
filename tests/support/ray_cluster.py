"""A local Ray cluster for tests/cluster (`ray.cluster_utils.Cluster` on this machine), the driver
connected to it: the Ray Serve application's tests (test_ray_app.py) and the shipped CPU example
(test_ray_cpu_example.py) start theirs with it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def local_ray_cluster(cpus_per_node: list[int], workdir: Path | None = None) -> Iterator[object]:
    """Nodes with these CPU counts (the first is the head); yields the cluster, `ray.init`ed with
    OMP_NUM_THREADS=1 for its workers. Ray starts workers in the directory its head node was
    started in (as `ray start` there does): `workdir`, else this process's."""
    import ray
    from ray.cluster_utils import Cluster

    here = os.getcwd()
    os.chdir(workdir or here)
    try:
        cluster = Cluster(initialize_head=True,
                          head_node_args={"num_cpus": cpus_per_node[0], "include_dashboard": False})
        for cpus in cpus_per_node[1:]:
            cluster.add_node(num_cpus=cpus)
    finally:
        os.chdir(here)
    try:
        ray.init(address=cluster.address, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
