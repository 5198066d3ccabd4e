"""Checks of CRI requests at the door, before any side effect.

Pure functions over the request messages (and the host facts they are given): each raises
InvalidArgument naming the field and the rule, or FailedPrecondition for what this host
cannot do. `requests.py` is the one entry (`RequestChecks`, a method per request, called
by the servicers); `fields.py` holds the rules shared by several requests, `sandbox.py`
the PodSandboxConfig, `container.py` the ContainerConfig, `resources.py` the resource
ranges of both and of their updates, `checkpoint.py` CheckpointContainer's.
"""
