"""Side-by-side CRI benchmark: crishim vs containerd (see hack/bench --help)."""
