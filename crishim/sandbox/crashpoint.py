"""Fault injection for e2e tests: CRISHIM_TEST_CRASH_AT=<step> kills the daemon there.

The daemon calls `crash_point("<step>")` at named steps; when the env var names that step
the process exits at once with status 137 (as after kill -9), leaving whatever was half
done for startup reconciliation. Sandbox steps, in RunPodSandbox order:
  sandbox-after-intent      intent recorded, nothing created yet
  sandbox-after-netns       netns pinned, no CNI ADD yet
  sandbox-after-cni-add     CNI ADD done (IP allocated), no pod files / pause yet
  sandbox-before-pause-start  pause created by conmon+runc, not started
  sandbox-before-ready      pause running, READY not yet persisted
"""

from __future__ import annotations

import os

ENV = "CRISHIM_TEST_CRASH_AT"


def crash_point(step: str) -> None:
    if os.environ.get(ENV) == step:
        os._exit(137)
