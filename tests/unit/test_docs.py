"""The README stays a true front page: every page it links exists, every link between the
docs pages resolves, and every command it shows parses (each tool's own `--help`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SHARED_BIN = REPO.parent / "shared" / "bin"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
README_MAX_LINES = 200


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if "://" not in t]


def _shell_commands(page: Path) -> list[list[str]]:
    """The command lines of the page's ```sh blocks, comments dropped."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def test_readme_is_a_front_page() -> None:
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


def test_every_page_the_readme_links_exists() -> None:
    links = _links(README)
    assert any(t.startswith("docs/") for t in links)
    for target in links:
        assert (REPO / target).exists(), f"README links {target}, which does not exist"


def test_links_between_docs_pages_resolve() -> None:
    pages = sorted((REPO / "docs").glob("*.md"))
    assert pages
    for page in pages:
        for target in _links(page):
            assert (page.parent / target).exists(), f"{page.name} links {target}"


def _help_argv(words: list[str]) -> list[str] | None:
    """How to ask the command's own tool whether these arguments parse, or None when the
    tool is not on this machine."""
    tool, args = words[0], words[1:]
    if "--" in args:  # the rest goes to pytest, which the script does not parse
        args = args[:args.index("--")]
    args = [a for a in args if a != "..."]
    if tool.startswith("hack/"):
        return [str(REPO / tool), *args, "--help"]
    if tool == "crishim":
        return [sys.executable, "-c", "import sys; from crishim.cli import main; "
                "sys.exit(main(sys.argv[1:]))", *args, "--help"]
    if tool in ("crictl", "kubelet"):
        path = SHARED_BIN / tool
        return [str(path), *args, "--help"] if path.exists() else None
    raise AssertionError(f"the README shows {tool}, which this test does not know: add it")


def test_every_command_the_readme_shows_parses() -> None:
    commands = _shell_commands(README)
    assert commands
    checked = 0
    for words in commands:
        argv = _help_argv(words)
        if argv is None:
            continue
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
        assert proc.returncode == 0, f"`{shlex.join(words)}` does not parse: {proc.stderr}"
        checked += 1
    if os.environ.get("CI") and not SHARED_BIN.exists():
        pytest.fail("CI without ../shared/bin: crictl and kubelet lines went unchecked")
    assert checked >= sum(w[0].startswith("hack/") for w in commands) > 0
