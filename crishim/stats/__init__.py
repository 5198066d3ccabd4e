"""Resource statistics: cgroup readers, CPU rates, writable-layer usage, pod network."""
