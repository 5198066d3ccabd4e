"""OCI runtime plumbing: the runc/crun CLI, conmon, exit files and runtime specs."""

from crishim.oci.runc import OCIRuntime, OCIRuntimeError, RuntimeRegistry

__all__ = ["OCIRuntime", "OCIRuntimeError", "RuntimeRegistry"]
