"""CI runs what the README's first screen tells a new user to run: its one install command and
its one test command, word for word (.ci/run only adds pip's quiet flag)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _first_screen() -> list[str]:
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, flags=re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_first_screen_has_one_install_and_one_test_command():
    lines = _first_screen()
    assert len([line for line in lines if line.startswith("pip install ")]) == 1
    assert len([line for line in lines if line.startswith("python -m pytest")]) == 1


def test_ci_runs_the_readmes_install_and_test_commands():
    lines = _first_screen()
    (install,) = [line for line in lines if line.startswith("pip install ")]
    (test,) = [line for line in lines if line.startswith("python -m pytest")]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert test in ci
    ci_installs = [line.removeprefix("quiet python -m pip install -q ") for line in ci
                   if line.startswith("quiet python -m pip install -q ") and "--upgrade pip" not in line]
    assert ci_installs == [install.removeprefix("pip install ")]
