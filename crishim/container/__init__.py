"""Container lifecycle: the CRI's container RPCs as steps over records, bundles, conmon and
the OCI runtime, one concern a module (docs/architecture.md, "container")."""
