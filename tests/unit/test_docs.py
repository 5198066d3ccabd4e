"""The README stays a true front page: every page it links exists, every link between the
docs pages resolves, and every command it and the quickstart show parses (each tool's own
`--help`); the quickstart's pod and container JSON are CRI configs; architecture.md reads
in short paragraphs."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format

from crishim.api.runtime.v1 import api_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
QUICKSTART = REPO / "docs" / "quickstart.md"
PAGES_WITH_COMMANDS = (README, QUICKSTART)
SHARED_BIN = REPO.parent / "shared" / "bin"
DOCKER_REGISTRY = "/usr/bin/docker-registry"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
README_MAX_LINES = 200
ARCHITECTURE = REPO / "docs" / "architecture.md"
# A paragraph (or a list item's) of architecture.md, in characters: past this, split it.
MAX_PARAGRAPH = 600


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if "://" not in t]


def _shell_commands(page: Path) -> list[list[str]]:
    """The command lines of the page's ```sh blocks, comments dropped; `X=$(cmd ...)` is
    `cmd ...` and a trailing `&` goes."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"^[A-Z_]+=\$\((.*)\)\s*$", r"\1", line.strip())
            words = shlex.split(line.removesuffix("&"), comments=True)
            if words:
                out.append(words)
    return out


def _without_operands(args: list[str]) -> list[str]:
    """crictl's arguments up to its subcommand's first operand (an ID in a variable, a
    file, an image), which `--help` would take for a help topic."""
    sub = next((i for i, a in enumerate(args) if re.fullmatch(r"[a-z]+", a)), len(args))
    for i in range(sub + 1, len(args)):
        a = args[i]
        if a.startswith("$") or a.endswith((".json", ".yaml", ".yml")) or (
                not a.startswith("-") and ("/" in a or ":" in a)):
            return args[:i]
    return args


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
        if tool == "crictl":
            args = _without_operands(args)
        return [str(path), *args, "--help"] if path.exists() else None
    if tool == "docker-registry":
        return [DOCKER_REGISTRY, *args, "--help"] if os.path.exists(DOCKER_REGISTRY) else None
    raise AssertionError(f"a page shows {tool}, which this test does not know: add it")


@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS, ids=lambda p: p.name)
def test_every_command_the_page_shows_parses(page: Path) -> None:
    commands = _shell_commands(page)
    assert commands
    checked = 0
    for words in commands:
        argv = _help_argv(words)
        if argv is None:
            continue
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
        assert proc.returncode == 0, \
            f"{page.name}: `{shlex.join(words)}` does not parse: {proc.stderr}"
        checked += 1
    if os.environ.get("CI") and not SHARED_BIN.exists():
        pytest.fail("CI without ../shared/bin: crictl and kubelet lines went unchecked")
    assert checked >= sum(w[0].startswith("hack/") for w in commands) > 0


def test_the_readme_links_the_quickstart() -> None:
    assert "docs/quickstart.md" in _links(README)


def test_the_quickstart_json_is_a_pod_and_a_container_config() -> None:
    """Parsed as crictl parses them (the CRI messages' JSON); a misspelt field fails."""
    blocks = [json.loads(b) for b in
              re.findall(r"```json\n(.*?)```", QUICKSTART.read_text(), flags=re.S)]
    assert len(blocks) == 2
    pod = json_format.ParseDict(blocks[0], pb.PodSandboxConfig())
    ctr = json_format.ParseDict(blocks[1], pb.ContainerConfig())
    assert pod.metadata.name and pod.metadata.uid and pod.metadata.namespace
    assert ctr.metadata.name and ctr.image.image and ctr.log_path
    # The image the container names is the one the page pulls.
    pulled = [w[2] for w in _shell_commands(QUICKSTART) if w[:2] == ["crictl", "pull"]]
    assert ctr.image.image in pulled


def _paragraphs(page: Path) -> list[str]:
    """The prose paragraphs of `page`, each list item apart; no code, headings or tables."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.splitlines() if not ln.startswith(("#", "|"))]
        items: list[list[str]] = []
        for line in lines:
            if line.startswith("- ") or not items:
                items.append([])
            items[-1].append(line.strip())
        out.extend(" ".join(item) for item in items if item)
    return out


def test_architecture_paragraphs_are_short() -> None:
    long = [p[:60] for p in _paragraphs(ARCHITECTURE) if len(p) > MAX_PARAGRAPH]
    assert _paragraphs(ARCHITECTURE)
    assert not long, f"paragraphs over {MAX_PARAGRAPH} characters: {long}"
