"""Fault injection for e2e tests: CRISHIM_TEST_CRASH_AT=<step> kills the daemon there.

The daemon calls `crash_point("<step>")` at named steps of its multi-step operations; when
the env var names that step the process exits at once with status 137 (as after kill -9),
leaving whatever was half done for startup reconciliation. Unset (production) it is a dict
lookup. docs/durability.md says what is recorded at each step and how a restart repairs it.
`STEPS` lists every step name (tests iterate over it); keep it in the order the steps run.
"""

from __future__ import annotations

import os

ENV = "CRISHIM_TEST_CRASH_AT"
EXIT_STATUS = 137

STEPS: dict[str, str] = {
    # RunPodSandbox
    "sandbox-after-intent": "intent recorded, nothing created yet",
    "sandbox-after-netns": "netns pinned, no CNI ADD yet",
    "sandbox-after-cni-add": "CNI ADD done (IP held), pause created, no pod files",
    "sandbox-before-pause-start": "pod files written, pause created, not started",
    "sandbox-before-ready": "pause running, READY not yet persisted",
    # StopPodSandbox
    "sandbox-stop-after-containers": "pod containers stopped, pause still running",
    "sandbox-stop-after-teardown": "pause stopped and network released (CNI DEL, netns "
                                   "unpinned), pod mounts still there, record still READY",
    "sandbox-stop-before-persist": "pod mounts (shm, pause rootfs) released, NOTREADY "
                                   "not yet persisted",
    # RemovePodSandbox
    "sandbox-remove-after-containers": "pod containers removed, pod files still there",
    "sandbox-remove-before-delete": "pod mounts released, record (and files) not yet deleted",
    # CreateContainer
    "container-after-intent": "create intent recorded, nothing created yet",
    "container-after-quota": "bundle dir made with its project quota (a capped container), "
                             "no rootfs yet",
    "container-after-rootfs": "overlay rootfs mounted, bundle not written yet",
    "container-before-record": "bundle written, rootfs mounted, record not saved",
    # StartContainer
    "container-before-start": "record CREATED, conmon and runc not yet run",
    "container-after-launch": "conmon ran `runc create`, the pid not yet persisted",
    "container-after-start": "runc start done, RUNNING not yet persisted",
    # RemoveContainer (of an exited container)
    "container-remove-before-files": "runc container deleted and rootfs unmounted at exit; "
                                     "files and record still there",
    # PullImage
    "image-after-layer-download": "a layer downloaded and unpacked into tmp, not committed",
    "image-after-layer-unpack": "a layer committed to its final dir, image not recorded",
    "image-before-metadata": "all layers and blobs written, image record not saved",
}


def crash_point(step: str) -> None:
    """Exit the process at once (no cleanup, no atexit) if the test asked for `step`."""
    if os.environ.get(ENV) == step:
        os._exit(EXIT_STATUS)
