"""CDI (Container Device Interface): devices named `vendor.com/class=name` whose spec
files, in the CDI spec directories, say how to edit a container's OCI spec to expose
them (device nodes, mounts, env, hooks, groups)."""
