"""The OCI runtime's process side: the runc/crun CLI, conmon, exec, kill, pidfd and exit-file
watching, and the CRIU probe."""

from crishim.runtime.runc import OCIRuntime, OCIRuntimeError, RuntimeRegistry

__all__ = ["OCIRuntime", "OCIRuntimeError", "RuntimeRegistry"]
