"""The fenced code blocks of the README and docs/, and the marks that say which can run in CI
(docs/contributing.md#examples-that-cannot-rot is the convention; tests/unit/test_docs_examples.py
enforces and runs it).

A block is a command block when its info string is `bash` or `python`: it runs in the test suite
unless the line before it is a mark `<!-- example: KIND (why) -->` with a KIND below. Any other
block is shown, never run: output, JSON, YAML, diagrams (`text`, `json`, `yaml`, `mermaid`, or no
language for literal output and ASCII pictures).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

COMMAND_LANGS = frozenset({"bash", "python"})
LITERAL_LANGS = frozenset({"", "text", "json", "yaml", "mermaid"})

# KIND -> whether it needs a reason in parentheses. A command block without a mark runs.
MARKS = {
    "serves": False,         # `higgs-serve serve` lines: each started (free port), must reach /ready, stopped
    "installs": True,        # an install: .ci/run runs the README's install line on a clean clone
    "needs-gpu": True,       # CUDA (and usually the real geometry)
    "needs-weights": True,   # the real checkpoint (hub download or a local copy)
    "needs-cluster": True,   # a Ray cluster or several machines
    "needs-tool": True,      # a program or device the CI machine lacks (an audio device, c2patool, a certificate)
    "covered": True,         # run elsewhere in the suite as it is written: the reason names the test
    "synopsis": False,       # a usage line with [--optional] parts: not run; parsed without them
    "excerpt": False,        # python shown for reading (a contract, pseudo-code), not a program
}

_MARK = re.compile(r"<!-- example: (?P<kind>[a-z-]+)(?: \((?P<why>[^)]+)\))? -->")
_OPEN = re.compile(r"^(?P<indent> *)```(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    mark: str | None  # a KIND of MARKS, or None
    why: str | None
    mark_text: str | None  # the mark's line as written (None without one)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def is_command(self) -> bool:
        return self.lang in COMMAND_LANGS


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, info = opening["indent"], opening["info"].strip()
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == f"{indent}```")
        body = "\n".join(line[len(indent):] for line in lines[i + 1:end]) + "\n"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.fullmatch(before)
        found.append(Block(path, i + 1, info.split()[0] if info else "", body,
                           mark["kind"] if mark else None, mark["why"] if mark else None,
                           before if mark else None))
        i = end + 1
    return found


def higgs_serve_commands(body: str) -> list[str]:
    """The `higgs-serve ...` command lines of a bash block, continuation lines joined, comments
    dropped; lines with a command substitution are left out (they run, but do not split as words)."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.strip() for line in joined.splitlines()
            if line.strip().startswith("higgs-serve ") and "$(" not in line]


def argv_words(command: str) -> list[str]:
    """A command line's words, its `[--flag ...]` optional parts (a usage line's) left out."""
    while True:
        shorter = re.sub(r"\[--[^\[\]]*\]", "", command)
        if shorter == command:
            return shlex.split(command, comments=True)
        command = shorter
