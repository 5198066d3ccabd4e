"""Pod sandboxes: the pause container, its namespaces, pod files and network."""
