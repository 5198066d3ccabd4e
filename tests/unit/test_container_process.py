"""argv and env merging: Docker/containerd rules for ENTRYPOINT/CMD vs CRI command/args."""

from __future__ import annotations

import pytest

from crishim.container.process import DEFAULT_PATH, container_env, merge_env, process_args
from crishim.errors import InvalidArgument


@pytest.mark.parametrize(("command", "args", "ep", "cmd", "want"), [
    ([], [], ["/ep"], ["c1", "c2"], ["/ep", "c1", "c2"]),          # image only
    ([], ["a"], ["/ep"], ["c1"], ["/ep", "a"]),                      # args replace CMD
    (["/x"], [], ["/ep"], ["c1"], ["/x"]),                           # command drops ep+CMD
    (["/x"], ["a", "b"], ["/ep"], ["c1"], ["/x", "a", "b"]),
    ([], [], None, ["sh", "-c", "true"], ["sh", "-c", "true"]),      # CMD only
    ([], ["a"], [""], ["c"], ["a"]),                                 # ENTRYPOINT [""] = reset
    ([], [], ["/ep"], None, ["/ep"]),
])
def test_process_args(command: list[str], args: list[str], ep: list[str] | None,
                      cmd: list[str] | None, want: list[str]) -> None:
    assert process_args(command, args, ep, cmd) == want


def test_no_command_at_all_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="no command"):
        process_args([], [], None, None)


def test_env_later_layers_override_in_place() -> None:
    assert merge_env(["A=1", "B=2"], ["B=3", "C=4"], ["A=5"]) == ["A=5", "B=3", "C=4"]


def test_container_env_order_and_override() -> None:
    env = container_env("web-0", ["PATH=/img/bin", "FOO=img"], [("FOO", "cri"), ("X", "a=b")])
    assert env == ["PATH=/img/bin", "HOSTNAME=web-0", "FOO=cri", "X=a=b"]
    assert container_env("", None, [])[0] == DEFAULT_PATH
