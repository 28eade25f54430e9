"""Which replicas `serve --data-parallel-size/--devices` starts, and the flags' errors."""

import pytest

from higgs_serve.cli import main
from higgs_serve.cluster.launch import plan_devices
from higgs_serve.errors import HiggsServeError


def test_devices_from_the_flags():
    assert plan_devices(2, None, "cpu", 0) == ("cpu", "cpu")
    assert plan_devices(3, None, None, 4) == ("0", "1", "2")
    assert plan_devices(None, "2,3", None, 4) == ("2", "3")
    assert plan_devices(2, "0,0", None, 1) == ("0", "0")  # two engines share GPU 0


@pytest.mark.parametrize("size, devices, device, cuda, message", [
    (0, None, "cpu", 0, "must be >= 1"),
    (4, None, None, 2, "needs as many GPUs"),
    (None, "0,x", None, 2, "GPU indices"),
    (3, "0,1", None, 2, "does not match"),
    (None, "0,5", None, 2, "5 do not exist"),
    (None, "0", "cpu", 0, "--device cpu"),
])
def test_bad_flags_are_named(size, devices, device, cuda, message):
    with pytest.raises(HiggsServeError, match=message):
        plan_devices(size, devices, device, cuda)


def test_the_cli_reports_a_bad_flag_without_a_traceback(tiny_model_dir, capsys):
    code = main(["serve", str(tiny_model_dir), "--device", "cpu", "--data-parallel-size", "0"])
    assert code == 2
    assert "--data-parallel-size must be >= 1" in capsys.readouterr().err


def test_the_front_end_refuses_uds(tiny_model_dir, capsys, tmp_path):
    code = main(["serve", str(tiny_model_dir), "--device", "cpu", "--data-parallel-size", "2",
                 "--uds", str(tmp_path / "s.sock")])
    assert code == 2
    assert "--uds: the data-parallel front end listens on --host/--port" in capsys.readouterr().err
