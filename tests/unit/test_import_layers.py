"""Imports point one way: every module under src/higgs_serve is parsed with `ast` (nothing is
imported), and each `higgs_serve.*` import is checked against the layer table below.

Which imports count:
  * every import statement anywhere in a module, including the lazy ones inside functions: a lazy
    import is still a dependency the code has at run time;
  * imports under `if TYPE_CHECKING:` count for the layer direction and the cycles too. They never
    run, but a lower layer naming a higher layer's type in its signatures still has to know about
    that layer, which is what the direction rule is about (today all of them point down). They do
    not count for the torch rule, which is about what importing a module loads.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "higgs_serve"

# Higher number = higher layer. A package may import its own layer or any lower one, never a
# higher one. Top-level modules (cli.py, progress.py, ...) count as packages of their own name.
LAYERS = {
    "cli": 9, "cli_options": 9, "preflight": 9, "synth_report": 9,  # the command line and its helpers
    "cli_replica": 9,  # the CLI as a data-parallel replica (its access log without the supervisor's polls)
    "cluster": 8,  # scale-out: a front end over N servers, reusing the server's routers and plans
    "server": 7,
    "voices": 6,  # the voice registry and reference encoding: used by the server, uses the engine
    "engine": 5,
    "worker": 4,
    "model": 3, "codec": 3,
    "kernels": 2,
    "sampling_params": 1,  # a request's knobs: validated with config's checks
    "config": 0, "errors": 0, "audio": 0, "text": 0, "metrics": 0,
    "alignment": 0,  # word timestamps: aligners and their text normalisation (uses audio, text)
    "graph_batches": 0,  # the batch sizes captured as CUDA graphs (codec and watermark)
    "progress": 0,  # the on_progress callback type and its terminal/log reporter: loaders take callbacks
}

# Engine modules that must load without torch (ints, ids and NumPy only). builder.py is the one
# engine module that imports torch; core.py holds the runners it is given.
TORCH_FREE_ENGINE = ("scheduler", "kv_cache_manager", "request", "speech", "input_processor")

@dataclass(frozen=True)
class Import:
    source: str  # importing module, e.g. "higgs_serve.engine.core"
    target: str  # imported module, e.g. "higgs_serve.worker.model_runner"
    line: int
    type_checking: bool  # under `if TYPE_CHECKING:`
    module_level: bool  # runs when the module is imported (not inside a function)


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    if name.split(".")[0] != "higgs_serve":
        return False
    path = SRC.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_of(path: Path) -> list[Import]:
    source = _module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, type_checking: bool, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(source, alias.name, child.lineno, type_checking, module_level))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against the importing package
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found.append(Import(source, base, child.lineno, type_checking, module_level))
                for alias in child.names:  # `from higgs_serve.kernels import pdl` loads a module
                    if _is_module(f"{base}.{alias.name}"):
                        found.append(Import(source, f"{base}.{alias.name}", child.lineno,
                                            type_checking, module_level))
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), True, module_level)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), type_checking, module_level)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, type_checking, False)
            else:
                visit(child, type_checking, module_level)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False, True)
    return found


def _all_imports() -> list[Import]:
    return [imp for path in sorted(SRC.rglob("*.py")) for imp in _imports_of(path)]


def _package(module: str) -> str | None:
    """"higgs_serve.engine.core" -> "engine"; "higgs_serve.cli" -> "cli"; others -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "higgs_serve" and len(parts) > 1 else None


def test_every_package_is_in_the_layer_table():
    packages = {_package(_module_name(p)) for p in SRC.rglob("*.py")} - {None}
    assert packages <= set(LAYERS), f"add to LAYERS: {sorted(packages - set(LAYERS))}"


def test_the_layer_table_names_only_what_exists():
    packages = {_package(_module_name(p)) for p in SRC.rglob("*.py")} - {None}
    assert set(LAYERS) <= packages, f"remove from LAYERS: {sorted(set(LAYERS) - packages)}"


def test_no_package_imports_a_higher_layer():
    upward = []
    for imp in _all_imports():
        src, dst = _package(imp.source), _package(imp.target)
        if src and dst and LAYERS[dst] > LAYERS[src]:
            upward.append(f"{imp.source}:{imp.line} imports {imp.target} ({src} {LAYERS[src]} -> "
                          f"{dst} {LAYERS[dst]})")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_cycles_between_packages():
    graph: dict[str, set[str]] = {}
    for imp in _all_imports():
        src, dst = _package(imp.source), _package(imp.target)
        if src and dst and src != dst:
            graph.setdefault(src, set()).add(dst)
    assert _cycles(graph) == []


def test_no_import_cycles_between_modules():
    """Within a package too: no module reaches itself through its imports (lazy ones included)."""
    modules = {_module_name(p) for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for imp in _all_imports():
        if imp.target in modules and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
    assert _cycles(graph) == []


def test_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_builder_imports_torch_in_the_engine():
    direct = [f"{imp.source}:{imp.line}" for imp in _all_imports()
              if _package(imp.source) == "engine" and imp.target.split(".")[0] == "torch"
              and imp.source != "higgs_serve.engine.builder"]
    assert not direct, f"torch imported in the engine outside builder.py: {direct}"


def _loads_torch(module: str, by_module: dict[str, list[Import]], seen: set[str]) -> list[str]:
    """The import chain by which importing `module` loads torch ([] when it does not)."""
    if module in seen:
        return []
    seen.add(module)
    for imp in by_module.get(module, []):
        if imp.type_checking or not imp.module_level:
            continue
        if imp.target.split(".")[0] == "torch":
            return [module, "torch"]
        parts = imp.target.split(".")  # importing a.b.c runs a/__init__, a/b/__init__, then c
        for depth in range(2, len(parts) + 1):
            chain = _loads_torch(".".join(parts[:depth]), by_module, seen)
            if chain:
                return [module, *chain]
    return []


def test_the_engines_pure_modules_load_without_torch():
    by_module: dict[str, list[Import]] = {}
    for imp in _all_imports():
        by_module.setdefault(imp.source, []).append(imp)
    chains = {}
    for name in TORCH_FREE_ENGINE:
        chain = _loads_torch(f"higgs_serve.engine.{name}", by_module, set())
        if chain:
            chains[name] = " -> ".join(chain)
    assert not chains, f"engine modules that load torch: {chains}"
