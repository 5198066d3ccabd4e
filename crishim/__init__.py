"""crishim: a Kubernetes CRI v1 container runtime (runc under conmon, CNI, OCI images)."""

from importlib import metadata

try:
    __version__ = metadata.version("crishim")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0"
