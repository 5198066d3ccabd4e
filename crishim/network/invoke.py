"""Execute one CNI plugin: config on stdin, parameters in the environment, result on stdout."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from crishim.errors import DeadlineExceeded, FailedPrecondition, Internal, Unavailable
from crishim.log import get_logger
from crishim.observe import metrics, tracing
from crishim.proc import spawn

log = get_logger(__name__)

# A plugin that hangs this long (e.g. waiting on an xtables lock forever) is killed.
PLUGIN_TIMEOUT = 120.0


# CNI spec error codes that say what the user must change (version, config, environment)
# and the one that says "retry": the rest are plugin failures (INTERNAL).
_CNI_CONFIG_CODES = {1, 2, 4, 6, 7}
_CNI_TRY_AGAIN = 11


class CNIPluginError(Internal):
    """A plugin failed; `code`/`msg`/`details` come from its error JSON when it sent one.

    `missing` marks a plugin binary that is not installed: like a bad network config, the
    node is for the user to fix (FAILED_PRECONDITION)."""

    def __init__(self, plugin: str, command: str, code: int, msg: str, details: str = "",
                 *, missing: bool = False) -> None:
        if missing or code in _CNI_CONFIG_CODES:
            self.code = FailedPrecondition.code
        elif code == _CNI_TRY_AGAIN:
            self.code = Unavailable.code
        self.plugin = plugin
        self.command = command
        self.cni_code = code
        self.msg = msg
        self.details = details
        text = f"CNI plugin {plugin} {command} failed"
        if code:
            text += f" (code {code})"
        text += f": {msg}"
        if details:
            text += f": {details}"
        super().__init__(text)


@dataclass
class Invocation:
    command: str  # ADD, DEL, CHECK, STATUS, VERSION
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: str = ""
    path: str = ""  # CNI_PATH: all bin dirs joined by ':'

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(CNI_COMMAND=self.command, CNI_CONTAINERID=self.container_id,
                   CNI_NETNS=self.netns, CNI_IFNAME=self.ifname, CNI_ARGS=self.args,
                   CNI_PATH=self.path)
        if not self.netns:
            env.pop("CNI_NETNS")  # "not set" tells DEL the namespace is gone
        return env


def error_message(plugin: str, command: str, rc: int, stdout: bytes,
                  stderr: bytes) -> CNIPluginError:
    """Turn a failed run into an error, preferring the plugin's CNI error JSON."""
    try:
        data = json.loads(stdout or b"null")
    except ValueError:
        data = None
    if isinstance(data, dict) and ("msg" in data or "code" in data):
        code = data.get("code")
        return CNIPluginError(plugin, command, code if isinstance(code, int) else 0,
                              str(data.get("msg", "")), str(data.get("details", "") or ""))
    text = (stderr or stdout).decode(errors="replace").strip()
    return CNIPluginError(plugin, command, 0, text or f"exited with status {rc}")


async def exec_plugin(binary: str, conf: dict[str, Any], inv: Invocation,
                      limit_seconds: float = PLUGIN_TIMEOUT) -> dict[str, Any] | None:
    """Run `binary` and return its parsed JSON result (None when it printed nothing)."""
    name = os.path.basename(binary)
    with tracing.span(f"cni {inv.command} {name}", **{
            "cni.plugin": name, "cni.command": inv.command, "cni.ifname": inv.ifname,
            "cni.container_id": inv.container_id}), \
            metrics.timed(metrics.CNI_PLUGIN_DURATION, name, inv.command):
        return await _exec_plugin(binary, conf, inv, limit_seconds)


async def _exec_plugin(binary: str, conf: dict[str, Any], inv: Invocation,
                       limit_seconds: float) -> dict[str, Any] | None:
    started = time.monotonic()
    proc = await spawn.start([binary], stdin=spawn.PIPE, stdout=spawn.PIPE, stderr=spawn.PIPE,
                             env=inv.env(), cwd="/")
    name = os.path.basename(binary)
    try:
        stdout, stderr = await asyncio.wait_for(
            proc.communicate(json.dumps(conf).encode()), limit_seconds)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise DeadlineExceeded(f"CNI plugin {name} {inv.command} did not finish within "
                               f"{limit_seconds:.0f}s") from None
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    rc = proc.returncode or 0
    log.debug("cni plugin ran", plugin=name, command=inv.command, container=inv.container_id,
              rc=rc, seconds=round(time.monotonic() - started, 4))
    if rc != 0:
        raise error_message(name, inv.command, rc, stdout, stderr)
    if not stdout.strip():
        return None
    try:
        result = json.loads(stdout)
    except ValueError:
        raise CNIPluginError(name, inv.command, 0,
                             f"printed invalid JSON: {stdout[:200]!r}") from None
    if not isinstance(result, dict):
        raise CNIPluginError(name, inv.command, 0, "result is not a JSON object")
    return result
