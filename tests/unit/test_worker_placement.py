"""config/worker_processes.py and its settings: where the encoder and aligner processes run
(issue 54, host CPU isolation), validated once, working on any host down to a 2-core one."""

from __future__ import annotations

import pytest

from higgs_serve.config.worker_processes import (WorkerPlacement, format_cpu_list, parse_cpu_list,
                                                  server_cpus)
from higgs_serve.errors import ConfigError
from higgs_serve.server.settings import ServerSettings

HOST_16 = frozenset(range(16))


def test_auto_leaves_the_engines_cores_free_where_there_are_cores_to_spare():
    assert WorkerPlacement.resolve("auto", 10, 2, HOST_16) == WorkerPlacement(frozenset(range(2, 16)), 10)
    # replicas sharing a host: each engine process keeps its own two
    assert WorkerPlacement.resolve("auto", 10, 8, HOST_16).cpus == frozenset(range(8, 16))
    # a 2- or 3-core host (CI): the workers share every core, at the lower priority
    assert WorkerPlacement.resolve("auto", 10, 2, frozenset({0, 1})) == WorkerPlacement(None, 10)
    assert WorkerPlacement.resolve("auto", 10, 2, frozenset({0, 1, 2})).cpus is None
    assert WorkerPlacement.resolve("all", 0, 2, HOST_16) == WorkerPlacement(None, 0)
    assert WorkerPlacement.resolve(" 4-7,12 ", 3, 2, HOST_16).cpus == frozenset({4, 5, 6, 7, 12})


@pytest.mark.parametrize("cpus, nice, message", [
    ("x", 10, "worker_cpus must be 'auto', 'all' or a core list"),
    ("7-3", 10, "empty range"),
    ("2-20", 10, "names cores this server may not use: 16-20"),
    ("auto", 20, "worker_nice must be 0-19"),
    ("auto", -1, "worker_nice must be 0-19"),
])
def test_bad_values_are_config_errors_naming_the_setting(cpus, nice, message):
    with pytest.raises(ConfigError, match=message):
        WorkerPlacement.resolve(cpus, nice, 2, HOST_16)


def test_lists_round_trip_through_the_workers_command_line():
    cpus = parse_cpu_list("0-3,8,10-11")
    assert format_cpu_list(cpus) == "0-3,8,10-11"
    placement = WorkerPlacement(cpus, 4)
    assert WorkerPlacement.from_args(int(placement.to_args()[1]), placement.to_args()[3]) == placement
    assert WorkerPlacement.from_args(0, "all") == WorkerPlacement(None, 0)


def test_the_server_settings_resolve_it_once(tmp_path):
    settings = ServerSettings(voices_dir=tmp_path)
    expected = WorkerPlacement.resolve("auto", 10, 2, server_cpus())
    assert settings.worker_placement == expected and settings.worker_nice == 10
    with pytest.raises(ConfigError, match="--worker-timeout-s must be positive"):
        ServerSettings(voices_dir=tmp_path, worker_timeout_s=0)
    with pytest.raises(ConfigError, match="--alignment-queue-s must be positive"):
        ServerSettings(voices_dir=tmp_path, alignment_queue_s=-1)
    with pytest.raises(ConfigError, match="worker_cpus"):
        ServerSettings(voices_dir=tmp_path, worker_cpus="cores")


def test_the_flags_reach_the_settings_and_a_bad_one_is_one_line(tiny_model_dir, monkeypatch, capsys):
    from higgs_serve import cli

    seen = []
    monkeypatch.setattr("higgs_serve.server.app.run_server",
                        lambda model, settings, *a, **k: seen.append(settings))
    core = str(max(server_cpus()))
    assert cli.main(["serve", str(tiny_model_dir), "--device", "cpu", "--port", "0", "--worker-cpus", core,
                     "--worker-nice", "5", "--worker-timeout-s", "3", "--alignment-queue-s", "30"]) == 0
    settings = seen[0]
    assert settings.worker_placement == WorkerPlacement(frozenset({int(core)}), 5)
    assert (settings.worker_timeout_s, settings.alignment_queue_s) == (3.0, 30.0)
    assert cli.main(["serve", str(tiny_model_dir), "--device", "cpu", "--port", "0",
                     "--worker-cpus", "9999"]) != 0
    err = capsys.readouterr().err
    assert "worker_cpus names cores this server may not use: 9999" in err and "Traceback" not in err
