"""The import layering of crishim/ (docs/architecture.md, "Layers").

Every module belongs to a layer: a package of crishim/ by its name, a module at the
package root by its own. A module may import from its own layer and from lower ones,
never from a higher one, and no two modules may import each other, directly or around
a circle (inside one package too). Imports under `if TYPE_CHECKING:` count: a
type-only import still ties the two modules together for a reader and for mypy.

KNOWN_CLIMBS and KNOWN_CYCLES are what the tree still does against the rule; the test
fails when one of them is gone (so the list only shrinks) or when a new one appears.
"""

from __future__ import annotations

import ast
from pathlib import Path

import crishim

ROOT = Path(crishim.__file__).parent

# From the bottom. Names in one row form one layer and may import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("api", "__init__"),
    ("errors", "log"),
    ("config",),
    ("observe",),
    ("host",),
    ("proc",),
    ("oci",),
    ("runtime",),
    ("store",),
    ("network",),
    ("image",),
    ("cdi",),
    ("validate",),
    ("nri",),
    ("sandbox",),
    ("container",),
    ("stats",),
    ("streaming",),
    ("rpc",),
    ("node",),
    ("cri",),
    ("server",),
    ("cli", "__main__"),
)

KNOWN_CLIMBS: frozenset[tuple[str, str]] = frozenset()

KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1 and parts[:-1] != ["crishim"]:
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = _module_name(path)
        if name.startswith("crishim.api."):
            continue  # generated code
        found[name] = path
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def _imports(path: Path, name: str) -> set[str]:
    """The crishim modules `path` imports, at any depth of its code."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "crishim")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: -node.level]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "crishim":
                continue
            for alias in node.names:
                # `from crishim.pkg import mod` imports the module mod.
                sub = f"{module}.{alias.name}"
                out.add(sub if _is_module(sub) else module)
    out = {"crishim.__init__" if m == "crishim" else m for m in out}
    out.discard(name)
    return {m for m in out if not m.startswith("crishim.api.") and m != "crishim.api"}


def _layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for index, row in enumerate(LAYERS):
        if top in row:
            return index
    raise AssertionError(f"{module} is in no layer: add {top!r} to LAYERS")


def _graph() -> dict[str, set[str]]:
    return {name: _imports(path, name) for name, path in _modules().items()}


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        _layer_of(module)


def test_no_import_climbs() -> None:
    climbs = {
        (src, dst)
        for src, targets in _graph().items()
        for dst in targets
        if _layer_of(dst) > _layer_of(src)
    }
    assert climbs - KNOWN_CLIMBS == set(), "imports from a lower layer to a higher one"
    assert KNOWN_CLIMBS - climbs == set(), "fixed: take these out of KNOWN_CLIMBS"


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    cycles = _cycles(_graph())
    assert cycles - KNOWN_CYCLES == set(), "modules that import each other"
    assert KNOWN_CYCLES - cycles == set(), "fixed: take these out of KNOWN_CYCLES"


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == {frozenset({"a", "b", "c"})}


def test_the_docs_show_the_layer_table() -> None:
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    shown = [tuple(part.strip("` ") for part in row.split("|")[2].split(",")) for row in rows]
    assert tuple(reversed(shown)) == LAYERS


# gRPC is the edge's business: the servicers (cri/), the native server (rpc/) and the
# listener (server.py). Domain errors carry a Kind that cri/base.py maps to a status.
GRPC_AT_THE_EDGE = frozenset({"cri", "rpc", "server"})


def test_grpc_is_imported_only_at_the_edge() -> None:
    outside = set()
    for name, path in _modules().items():
        top = name.split(".")[1]
        if top in GRPC_AT_THE_EDGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                if any(a.name.split(".")[0] == "grpc" for a in node.names):
                    outside.add(name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpc":
                outside.add(name)
    assert outside == set()


def _package_importers() -> dict[str, set[str]]:
    """For each layer name, the other layer names whose modules import it."""
    importers: dict[str, set[str]] = {}
    for src, targets in _graph().items():
        for dst in targets:
            a, b = _top(src), _top(dst)
            if a != b:
                importers.setdefault(b, set()).add(a)
    return importers


def _top(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def _package_sections() -> list[tuple[tuple[str, ...], str]]:
    """The `### ` sections of docs/architecture.md's "Packages": (names, body)."""
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    section = doc.split("\n## Packages\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for chunk in section.split("\n### ")[1:]:
        heading, _, body = chunk.partition("\n")
        out.append((tuple(n.strip("` ") for n in heading.split(",")), body))
    return out


def test_every_package_has_a_section_naming_who_imports_it() -> None:
    """docs/architecture.md has a section per package whose "Imported by" line is true."""
    sections = _package_sections()
    named = [n for names, _ in sections for n in names]
    layered = [n for row in LAYERS for n in row if n != "__init__"]
    assert sorted(named) == sorted(layered), "one section per package of LAYERS"
    importers = _package_importers()
    for names, body in sections:
        line = " ".join(body.split("Imported by:", 1)[1].split("\n\n", 1)[0].split())
        if "not checked" in line:
            continue
        said = {w.strip("`,.") for w in line.split() if w.startswith("`")}
        actual = set().union(*(importers.get(n, set()) for n in names)) - set(names) - {"__init__"}
        assert said == actual, f"{names}: the docs say {sorted(said)}, the code {sorted(actual)}"


# The rooms a file may not outgrow (issue: the sandbox side like the container side).
MAX_LINES = {"container": 450, "sandbox": 450}
# At the package root: the entry points, config, log and errors; everything else has a room.
ROOT_MODULES = {"__init__.py", "__main__.py", "cli.py", "server.py", "config.py", "log.py",
                "errors.py"}


def test_no_file_in_the_lifecycle_packages_outgrows_its_limit() -> None:
    over = {str(path.relative_to(ROOT)): n
            for package, limit in MAX_LINES.items()
            for path in (ROOT / package).glob("*.py")
            if (n := len(path.read_text().splitlines())) > limit}
    assert over == {}


# Any module outside generated code (issue 54): one job each, so none grows past this.
MAX_MODULE_LINES = 600


def test_no_module_outgrows_the_module_limit() -> None:
    over = {str(path.relative_to(ROOT)): n
            for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert over == {}


def test_nothing_else_lies_loose_at_the_package_root() -> None:
    assert {p.name for p in ROOT.glob("*.py")} == ROOT_MODULES


def test_the_spec_package_starts_no_process() -> None:
    """oci/ is the spec alone: the process side (runtime/, proc/, subprocess) stays out."""
    for name, path in _modules().items():
        if _top(name) != "oci":
            continue
        reached = {m for m in _imports(path, name) if _top(m) in ("runtime", "proc")}
        text = path.read_text()
        assert reached == set(), f"{name} imports {sorted(reached)}"
        assert "import subprocess" not in text and "create_subprocess" not in text, name
