"""Making the configured AppArmor profile usable, once at start: crishim's own default
(oci/apparmor.py writes its text) is loaded with `apparmor_parser -Kr` (replace:
idempotent, and an upgraded crishim's profile takes effect for new containers); any other
name must already be loaded."""

from __future__ import annotations

import asyncio
import contextlib

from crishim.host.apparmor import SECURITYFS, UNCONFINED, AppArmorHost, is_loaded
from crishim.log import get_logger
from crishim.oci.apparmor import DEFAULT_PROFILE, AppArmorState, profile_text

log = get_logger(__name__)

_PARSER_TIMEOUT = 60.0


async def run_parser(parser: str, args: list[str], text: str) -> tuple[int, str]:
    """apparmor_parser with the profile on stdin; (exit code, its output)."""
    proc = await asyncio.create_subprocess_exec(
        parser, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(text.encode()),
                                        timeout=_PARSER_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return -1, f"no answer within {_PARSER_TIMEOUT:.0f}s"
    return proc.returncode or 0, out.decode(errors="replace").strip()


async def setup(profile: str, host: AppArmorHost) -> AppArmorState:
    """Make `profile` usable for RuntimeDefault containers on the `host` probed at start.

    crishim's own profile (DEFAULT_PROFILE) is generated and (re)loaded; any other name
    is the administrator's and must already be loaded; "unconfined" turns it off."""
    if not host.enabled:
        return AppArmorState(reason="the kernel has no AppArmor (no " + SECURITYFS + ")")
    parser = host.parser
    if parser is None:
        return AppArmorState(reason="apparmor_parser is not installed")
    if profile == UNCONFINED:
        return AppArmorState(enabled=True, reason="apparmor_profile is unconfined")
    if profile != DEFAULT_PROFILE:
        if await asyncio.to_thread(is_loaded, profile):
            return AppArmorState(enabled=True, default_profile=profile, reason="loaded")
        return AppArmorState(enabled=True, reason="configured profile missing",
                             error=f"AppArmor profile {profile!r} (apparmor_profile) is "
                                   "not loaded; load it with apparmor_parser")
    text = profile_text(profile, host.daemon_label, host.includes)
    # -K: no cache files written; -r: replace (adds when absent).
    code, out = await run_parser(parser, ["-Kr"], text)
    if code != 0:
        return AppArmorState(enabled=True, reason="default profile not loaded",
                             error=f"apparmor_parser -Kr {profile} failed ({code}): {out}")
    return AppArmorState(enabled=True, default_profile=profile, reason="loaded")


def log_state(state: AppArmorState) -> None:
    """Said once at start, so an operator sees why containers are (not) confined."""
    if state.error:
        log.error("AppArmor default profile unavailable; RuntimeDefault containers will "
                  "fail to create", error=state.error)
    elif state.default_profile:
        log.info("AppArmor default profile loaded", profile=state.default_profile)
    else:
        log.warning("AppArmor is off; containers run without an AppArmor profile",
                    reason=state.reason)
