"""Fault injection for e2e tests: CRISHIM_TEST_CRASH_AT=<step> kills the daemon there.

The daemon calls `crash_point("<step>")` at named steps; when the env var names that step
the process exits at once with status 137 (as after kill -9), leaving whatever was half
done for startup reconciliation. Sandbox steps, in RunPodSandbox order:
  sandbox-after-intent      intent recorded, nothing created yet
  sandbox-after-netns       netns pinned, no CNI ADD yet (ADD then runs concurrently
                            with creating the pause)
  sandbox-after-cni-add     CNI ADD done (IP allocated), pause created, no pod files
  sandbox-before-pause-start  pod files written, pause created by conmon+runc, not started
  sandbox-before-ready      pause running, READY not yet persisted
"""

from __future__ import annotations

import os

ENV = "CRISHIM_TEST_CRASH_AT"


def crash_point(step: str) -> None:
    if os.environ.get(ENV) == step:
        os._exit(137)
