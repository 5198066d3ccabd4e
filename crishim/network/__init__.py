"""Pod networking: pinned network namespaces (netns.py) and CNI (manager.py).

The sandbox layer pins a netns with `create_netns`, attaches it with
`NetworkManager.setup`, and undoes both with `teardown` + `remove_netns`.
"""
