"""The container process: argv from image ENTRYPOINT/CMD + CRI command/args, and env.

The argv rules are Docker's (and so containerd's and the kubelet's expectations):
- CRI `command` set: it replaces ENTRYPOINT, and the image CMD is dropped; argv =
  command + CRI args.
- CRI `command` empty: argv = image ENTRYPOINT + (CRI args if any, else image CMD).
An ENTRYPOINT of exactly [""] means "reset" in Docker and counts as empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from crishim.errors import InvalidArgument

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def process_args(command: Sequence[str], args: Sequence[str],
                 entrypoint: Sequence[str] | None, cmd: Sequence[str] | None) -> list[str]:
    """The argv the container runs; InvalidArgument when nothing at all is specified."""
    if command:
        argv = [*command, *args]
    else:
        ep = list(entrypoint or [])
        if ep == [""]:
            ep = []
        argv = ep + list(args or cmd or [])
    if not argv:
        raise InvalidArgument("no command specified: the image has no ENTRYPOINT/CMD and the "
                              "container config sets neither command nor args")
    return argv


def merge_env(*layers: Iterable[str]) -> list[str]:
    """Merge KEY=VALUE lists; a later layer replaces a key in place (first position kept)."""
    order: list[str] = []
    values: dict[str, str] = {}
    for layer in layers:
        for item in layer:
            key, sep, _ = item.partition("=")
            if not key:
                continue
            if key not in values:
                order.append(key)
            values[key] = item if sep else key + "="
    return [values[k] for k in order]


def container_env(hostname: str, image_env: Sequence[str] | None,
                  cri_env: Sequence[tuple[str, str]]) -> list[str]:
    """Env as containerd builds it: default PATH, HOSTNAME, image env, then CRI envs."""
    base = [DEFAULT_PATH]
    if hostname:
        base.append(f"HOSTNAME={hostname}")
    return merge_env(base, image_env or [], [f"{k}={v}" for k, v in cri_env])
