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


# a program named as a command (the first item of an argv list, a PATH lookup, a shell string
# given to subprocess): the Debian tools a fresh machine with Python and pip lacks; a label
# such as a clip's source named "espeak" is not one
_SYSTEM_PROGRAMS = re.compile(r"""(\[|which\(|Popen\(|run\(|check_output\(|call\(|system\()\s*f?["'](ffmpeg|ffprobe|espeak-ng|espeak)\b""")


def test_ci_installs_nothing_the_readme_does_not():
    """.ci/run installs no system package the README does not name: its one allowed exception is
    the README's own first-screen line for Chromium (the browser the playground's tests drive),
    run as written less `sudo` (CI runs as root), after an `apt-get update`."""
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    readme_installs = [line.removeprefix("sudo ") for line in _first_screen()
                       if re.search(r"\b(apt-get|apt)\s+install\b", line)]
    assert readme_installs == ["apt-get install -y chromium"]
    ci_installs = [line for line in ci if not line.startswith("#")
                   and re.search(r"\b(apt-get|apt|dnf|yum|apk|brew|conda)\s+install\b", line)]
    assert ci_installs == readme_installs, ci_installs
    system = [line for line in ci if not line.startswith("#") and re.search(r"\b(apt-get|apt|dnf|yum|apk|brew|conda)\b", line)]
    assert system == ["apt-get update -qq", *readme_installs], system


def test_no_test_or_benchmark_runs_a_system_program():
    """Tests and benchmarks decode through PyAV (FFmpeg's libraries) and speak through the
    espeakng-loader wheel (benchmarks/speech_clips.py): no `ffmpeg` or `espeak-ng` program."""
    found = [f"{path.relative_to(REPO)}:{number}"
             for folder in ("tests", "benchmarks") for path in sorted((REPO / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if _SYSTEM_PROGRAMS.search(line)]
    assert found == [], found
