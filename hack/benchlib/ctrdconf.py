"""containerd config files for the bench: format version 2 (containerd 1.x) and 3 (2.x).

Both say the same thing: own root, state, sockets, runc root and CNI network; the bench's
registry through `config_path`; the bench's pause image; `restrict_oom_score_adj` (this
host gives no CAP_SYS_RESOURCE); apparmor, selinux and CDI off, as for crishim. The 2.x one
follows ../shared/anchors/containerd-2.3.4/containerd.toml.template.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContainerdPaths:
    root: str
    state: str
    socket: str
    runc_root: str
    shim: str
    cni_bin: str
    cni_conf: str
    certs: str
    sandbox_image: str
    stream_port: int
    downloads: int


def v2(p: ContainerdPaths) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""\
version = 2
root = "{p.root}"
state = "{p.state}"
# Plugins the CRI path does not use; the opt plugin would write /opt/containerd.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "{p.socket}"

[ttrpc]
  address = "{p.socket}.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[{cri}]
  sandbox_image = "{p.sandbox_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "{p.stream_port}"
  max_concurrent_downloads = {p.downloads}
  enable_cdi = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "/usr/sbin/runc"
  Root = "{p.runc_root}"

[{cri}.cni]
  bin_dir = "{p.cni_bin}"
  conf_dir = "{p.cni_conf}"
  max_conf_num = 1

[{cri}.registry]
  config_path = "{p.certs}"
"""


def v3(p: ContainerdPaths, nri_disable: bool = False) -> str:
    """`nri_disable`: NRI off (it is on by default in 2.x)."""
    images = "plugins.'io.containerd.cri.v1.images'"
    rt = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""\
version = 3
root = '{p.root}'
state = '{p.state}'
# not the host's /etc/containerd/conf.d
imports = []
required_plugins = ['io.containerd.grpc.v1.cri']

[grpc]
  address = '{p.socket}'

[debug]
  level = 'info'

[{images}]
  snapshotter = 'overlayfs'
  max_concurrent_downloads = {p.downloads}

[{images}.pinned_images]
  sandbox = '{p.sandbox_image}'

[{images}.registry]
  config_path = '{p.certs}'

[{rt}]
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  enable_cdi = false
  # pod netns under its own state dir, not the shared /run/netns
  netns_mounts_under_state_dir = true

[{rt}.containerd]
  default_runtime_name = 'runc'

[{rt}.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
  runtime_path = '{p.shim}'
  sandboxer = 'podsandbox'

[{rt}.containerd.runtimes.runc.options]
  BinaryName = '/usr/sbin/runc'
  Root = '{p.runc_root}'
  SystemdCgroup = false

[{rt}.cni]
  bin_dirs = ['{p.cni_bin}']
  conf_dir = '{p.cni_conf}'
  max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '{p.stream_port}'

[plugins.'io.containerd.internal.v1.opt']
  path = '{p.root}/opt'

[plugins.'io.containerd.nri.v1.nri']
  disable = {'true' if nri_disable else 'false'}
  socket_path = '{p.state}/nri/nri.sock'

# The shims' sockets stay in the default /run/containerd/s (as 1.6's always do): named by
# a hash of our own address, they cannot clash, and a dir under the bench's work dir would
# make their paths longer than a unix socket path may be.

[plugins.'io.containerd.transfer.v1.local']
  config_path = '{p.certs}'
  max_concurrent_downloads = {p.downloads}
"""
