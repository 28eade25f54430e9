"""The house shows its rooms (docs/architecture.md#the-tree): no package grows past ~15 modules
flat, every sub-package says in its docstring what it owns, the server's rooms import along the
data path (request in → plan → run → audio out; routes and the WebSocket above them), and the
engine loop stays small. Parsed with `ast`, nothing imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_import_layers import SRC, _all_imports, _module_name

MAX_FLAT_MODULES = 15
CORE_MAX_LINES = 230  # engine/core.py is the loop only (DESIGN.md); what grows goes beside it

# The server's rooms, lowest first: a room may import its own or a lower one. "server" is the
# package's top-level modules, split by what they hold.
SERVER_ROOMS = {
    "settings": 0, "peer_fields": 0,  # frozen settings; what the peers' fields mean
    "errors": 1, "schemas": 1, "limits": 1, "auth": 1,  # the wire's shapes and bounds; who may call
    "last_mile": 2,  # audio out
    "state": 3,  # what the routers share (holds the last mile's pools)
    "plan": 4,  # request in -> SpeechPlan
    "run": 5,  # an admitted request in flight
    "websocket": 6,
    "routers": 7,
    "app": 8,
}


def _packages() -> list[Path]:
    return sorted({p.parent for p in SRC.rglob("__init__.py")})


def test_no_package_holds_more_than_15_modules_flat():
    crowded = {str(d.relative_to(SRC.parent)): n for d in _packages()
               if (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > MAX_FLAT_MODULES}
    assert not crowded, f"group these into sub-packages by concern: {crowded}"


def test_every_sub_package_says_what_it_owns():
    silent = [str(d.relative_to(SRC.parent)) for d in _packages() if d != SRC
              and not ast.get_docstring(ast.parse((d / "__init__.py").read_text(encoding="utf-8")))]
    assert not silent, f"a one-line docstring saying what each owns: {silent}"


def _server_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["higgs_serve", "server"] and len(parts) > 2 else None


def test_server_rooms_import_along_the_data_path():
    modules = {_module_name(p) for p in (SRC / "server").rglob("*.py")}
    rooms = {_server_room(m) for m in modules} - {None}
    assert rooms == set(SERVER_ROOMS), f"server rooms and SERVER_ROOMS differ: {sorted(rooms ^ set(SERVER_ROOMS))}"
    upward = [f"{imp.source}:{imp.line} imports {imp.target}" for imp in _all_imports()
              if (src := _server_room(imp.source)) and (dst := _server_room(imp.target))
              and SERVER_ROOMS[dst] > SERVER_ROOMS[src]]
    assert not upward, "server imports against the data path:\n" + "\n".join(upward)


def test_the_engine_loop_stays_small():
    lines = len((SRC / "engine" / "core.py").read_text(encoding="utf-8").splitlines())
    assert lines <= CORE_MAX_LINES, f"engine/core.py has {lines} lines (bound {CORE_MAX_LINES})"


def test_the_architecture_tree_names_every_package():
    """docs/architecture.md's tree picture names each package directory, and only those."""
    text = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## The tree", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    paths, parent = set(), ""
    for line in block.strip("\n").splitlines()[1:]:  # below "src/higgs_serve/"
        level = (len(line) - len(line.lstrip())) // 2
        names = re.findall(r"[\w/]+/", line.strip().split("   ")[0])
        for name in (n.rstrip("/") for n in names):
            paths.add(name if "/" in name or level == 1 else f"{parent}/{name}")
        if level == 1 and len(names) == 1:
            parent = names[0].rstrip("/")
    actual = {str(d.relative_to(SRC)) for d in _packages() if d != SRC}
    assert paths == actual, f"tree and packages differ: {sorted(paths ^ actual)}"
