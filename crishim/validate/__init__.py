"""Checks of CRI requests at the door, before any side effect.

Pure functions over the request messages (and the host facts they are given): each raises
InvalidArgument naming the field and the rule, or FailedPrecondition for what this host
cannot do. `fields.py` holds the rules shared by several requests, `pod.py` the
PodSandboxConfig, `container.py` the ContainerConfig; resource ranges are in
`crishim.oci.resources.validate`, next to the mapping they protect.
"""
