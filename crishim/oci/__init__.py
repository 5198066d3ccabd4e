"""OCI runtime specs: the config.json crishim writes and the pure mappings into it
(resources, seccomp, AppArmor, stop signals, cgroup slices, annotations). Nothing here
starts a process; that is crishim.runtime."""
