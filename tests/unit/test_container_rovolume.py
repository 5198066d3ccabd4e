"""Which binds of a user-namespaced container's spec get a locked read-only copy under its
bundle (container/rovolume.py)."""

from __future__ import annotations

from typing import Any

from crishim.container import rovolume

BUNDLE = "/var/lib/crishim/containers/c1"


def _spec(*mounts: dict[str, Any]) -> dict[str, Any]:
    return {"mounts": list(mounts)}


def test_read_only_binds_outside_the_bundle_are_planned() -> None:
    spec = _spec(
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["ro"]},
        {"destination": "/hp", "type": "bind", "source": "/srv/data",
         "options": ["rbind", "rprivate", "ro"]},
        {"destination": "/rw", "type": "bind", "source": "/srv/rw",
         "options": ["rbind", "rprivate", "rw"]},
        {"destination": "/rro", "type": "bind", "source": "/srv/tree",
         "options": ["rbind", "rslave", "rro"]},
        # CDI writes binds without a type, as the OCI spec allows.
        {"destination": "/dev/x", "source": "/opt/x", "options": ["bind", "ro"]},
        {"destination": "/iv", "type": "bind", "source": BUNDLE + "/image-volumes/0",
         "options": ["rbind", "rprivate", "ro"]},
        # Bidirectional: its mounts must reach the host, which a slave copy would stop.
        {"destination": "/bi", "type": "bind", "source": "/srv/bi",
         "options": ["rbind", "rshared", "ro"]},
    )
    got = rovolume.plan(spec, BUNDLE)
    assert [(b.index, b.source, b.target, b.recursive_bind, b.recursive_readonly)
            for b in got] == [
        (1, "/srv/data", BUNDLE + "/ro/1", True, False),
        (3, "/srv/tree", BUNDLE + "/ro/3", True, True),
        (4, "/opt/x", BUNDLE + "/ro/4", False, False),
    ]


def test_a_path_that_only_looks_inside_the_bundle_is_planned() -> None:
    spec = _spec(
        {"destination": "/a", "type": "bind", "source": BUNDLE + "/../c2/rootfs",
         "options": ["rbind", "ro"]},
        {"destination": "/b", "type": "bind", "source": BUNDLE + "x/data",
         "options": ["rbind", "ro"]},
    )
    assert [b.index for b in rovolume.plan(spec, BUNDLE)] == [0, 1]


def test_nothing_to_do_without_read_only_binds() -> None:
    assert rovolume.plan({}, BUNDLE) == []
    assert rovolume.plan(_spec({"destination": "/x", "type": "bind", "source": "rel",
                                "options": ["ro"]}), BUNDLE) == []
