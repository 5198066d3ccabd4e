"""The tests' own layout: no module under tests/ imports a test module (test_*.py) or a
conftest's private name; what several modules share lives in tests/fakes or in a plumbing
module of its own, so a test module can move or go without breaking another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    return ".".join(("tests", *path.relative_to(TESTS).with_suffix("").parts))


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    return _imports_in(path.read_text(), _module_name(path))


def _imports_in(source: str, module_name: str) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names imported from it) of each import in `source`, the
    text of module `module_name`."""
    tree = ast.parse(source, module_name)
    package = module_name.rsplit(".", 1)[0]
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            out.append((node.lineno, module, [alias.name for alias in node.names]))
    return out


def _is_test_module(dotted: str) -> bool:
    return dotted.startswith("tests.") and dotted.rsplit(".", 1)[-1].startswith("test_")


def test_no_module_under_tests_imports_a_test_module() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module, names in _imports(path):
            # `from tests.unit import test_x` imports the module test_x too.
            targets = [module, *(f"{module}.{n}" for n in names)]
            bad = [t for t in targets if _is_test_module(t)]
            if bad:
                found.append(f"{path.relative_to(TESTS.parent)}:{line} imports {bad[0]}")
    assert not found, ("test modules import other test modules; move what they share into "
                       "tests/fakes (or a plumbing module):\n" + "\n".join(found))


def test_no_module_imports_a_conftest_private_name() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module, names in _imports(path):
            if module.startswith("tests.") and module.endswith(".conftest"):
                found.extend(f"{path.relative_to(TESTS.parent)}:{line} imports {module}.{n}"
                             for n in names if n.startswith("_"))
    assert not found, "\n".join(found)


def test_the_check_sees_each_form_of_import() -> None:
    """The walks above would pass vacuously if they missed a form; each form is caught."""
    src = ("import tests.unit.test_a\n"
           "from tests.e2e.test_b import x\n"
           "from tests.kubelet import test_c\n"
           "from .test_d import y\n"
           "from tests.fakes.runtime import fake_runtime\n"
           "def f() -> None:\n"
           "    from tests.unit.test_e import z\n")
    seen = []
    for line, module, names in _imports_in(src, "tests.unit.probe"):
        targets = [module, *(f"{module}.{n}" for n in names)]
        seen.append((line, any(_is_test_module(t) for t in targets)))
    assert sorted(seen) == [(1, True), (2, True), (3, True), (4, True), (5, False), (7, True)]
