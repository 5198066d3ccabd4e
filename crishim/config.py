"""Configuration: defaults < TOML file < command-line flags.

Every setting lives in one dataclass tree so `crishim config` can print the effective
configuration back as TOML. Unknown keys in the file are an error (a typo should not be
silently ignored by a container runtime).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_FILE = "/etc/crishim/crishim.toml"


@dataclass
class RuntimeHandler:
    """An OCI runtime that a RuntimeClass handler name maps to."""

    path: str = "runc"
    # runc/crun --root; empty means <state>/<handler name>.
    root: str = ""


@dataclass
class CNIConfig:
    conf_dir: str = "/etc/cni/net.d"
    bin_dirs: list[str] = field(default_factory=lambda: ["/opt/cni/bin", "/usr/lib/cni"])
    # ADD results are cached here so DEL can be replayed after a crash; empty = <root>/cni.
    cache_dir: str = ""


@dataclass
class RegistryConfig:
    # containerd-compatible hosts.toml tree: <config_path>/<host>/hosts.toml
    config_path: str = "/etc/crishim/certs.d"
    max_concurrent_downloads: int = 4
    # Seconds a pull may wait on the registry without receiving a byte before it is
    # cancelled (containerd's name); 0 = wait for ever.
    image_pull_progress_timeout: float = 60.0
    # Bytes a layer may have once decompressed (its tar); a bigger one (a decompression
    # bomb) fails the pull. 0 = no limit. See docs/configuration.md for the default.
    max_layer_uncompressed_size: int = 16 * 1024**3


@dataclass
class StreamingConfig:
    address: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port at start
    idle_timeout: float = 4 * 3600.0
    tls_cert: str = ""
    tls_key: str = ""


@dataclass
class MetricsConfig:
    address: str = ""  # host:port of the Prometheus endpoint; empty = off


@dataclass
class DefaultValidatorConfig:
    """`[nri.default_validator]`; every key is containerd's, with its default."""

    enable: bool = False
    reject_oci_hook_adjustment: bool = False
    reject_runtime_default_seccomp_adjustment: bool = False
    reject_unconfined_seccomp_adjustment: bool = False
    reject_custom_seccomp_adjustment: bool = False
    reject_namespace_adjustment: bool = False
    reject_sysctl_adjustment: bool = False
    required_plugins: list[str] = field(default_factory=list)
    # A pod annotation that, set to true, lets the pod run without its required plugins.
    tolerate_missing_plugins_annotation: str = ""


@dataclass
class NRIConfig:
    """NRI (containerd/nri v0.12 plugins): docs/nri.md."""

    enable: bool = True
    socket_path: str = "/var/run/nri/nri.sock"
    plugin_path: str = "/opt/nri/plugins"
    plugin_config_path: str = "/etc/nri/conf.d"
    # Seconds, as containerd's defaults (5s, 2s).
    plugin_registration_timeout: float = 5.0
    plugin_request_timeout: float = 2.0
    # Only pre-installed plugins (plugin_path); no socket for external ones.
    disable_connections: bool = False
    default_validator: DefaultValidatorConfig = field(default_factory=DefaultValidatorConfig)


@dataclass
class StorageConfig:
    """`[storage]`: caps on a container's writable layer (docs/storage.md). Sizes are
    bytes or a number with a binary (Ki, Mi, Gi, Ti) or decimal (k, M, G, T) suffix;
    empty = off."""

    # The cap of every container that does not ask for its own.
    container_rootfs_size: str = ""
    # The most a pod may ask for with its annotation; empty = pods may not ask.
    container_rootfs_size_max: str = ""


@dataclass
class TracingConfig:
    """OpenTelemetry traces over OTLP (docs/configuration.md, `[tracing]`)."""

    # Empty = the protocol's usual local collector (127.0.0.1:4317, or
    # http://127.0.0.1:4318/v1/traces).
    endpoint: str = ""
    protocol: str = "grpc"
    # Root spans sampled per million; a caller's sampled trace context is followed
    # whatever this is, as long as it is not 0 (off: no span is made at all).
    sampling_rate_per_million: int = 0
    service_name: str = "crishim"
    # Ended spans waiting for the exporter; beyond it new spans are dropped (the SDK's
    # default: enough for a node's pod churn between two 5 s exports).
    max_queue_size: int = 2048


TRACING_PROTOCOLS = ("grpc", "http/protobuf")
GRPC_SERVERS = ("grpcio", "native")

_SIZE_UNITS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
               "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_size(text: str) -> int | None:
    """Bytes of "64Mi", "10G", "1048576" (> 0); None if `text` is none of those."""
    text = text.strip()
    digits = len(text) - len(text.lstrip("0123456789"))
    number, unit = text[:digits], text[digits:]
    if not number or unit not in _SIZE_UNITS or int(number) == 0:
        return None
    return int(number) * _SIZE_UNITS[unit]


@dataclass
class Config:
    listen: str = "unix:///run/crishim/crishim.sock"
    root: str = "/var/lib/crishim"
    # The image store (blobs, unpacked layers); empty = <root>/images. Containers'
    # writable layers, bundles and pod state stay under root (docs/storage.md).
    image_root: str = ""
    state: str = "/run/crishim"
    log_level: str = "info"
    # "cgroupfs" or "systemd"; empty = detect (systemd when it runs as init).
    cgroup_driver: str = ""
    # A resource whose cgroup controller the host lacks (e.g. hugepage limits without a
    # hugetlb hierarchy): "drop" runs the container without it (logged once at start),
    # "fail" refuses the request with FAILED_PRECONDITION.
    missing_cgroup_controller: str = "drop"
    # Empty = the embedded pause built from the host's static catatonit.
    pause_image: str = ""
    catatonit_path: str = "/usr/bin/catatonit"
    conmon_path: str = "conmon"
    default_runtime: str = "runc"
    runtimes: dict[str, RuntimeHandler] = field(
        default_factory=lambda: {"runc": RuntimeHandler("runc"), "crun": RuntimeHandler("crun")}
    )
    # Seconds that SIGTERM waits for in-flight calls before the process exits.
    drain_timeout: float = 10.0
    # The gRPC server behind the socket: "grpcio", or "native" (crishim/rpc: HTTP/2 on
    # the event loop itself, without grpcio's thread hand-offs).
    grpc_server: str = "native"
    # What clients of the socket can make the native server hold (docs/configuration.md):
    # connections (extra ones closed at once), streams per connection (extra ones
    # refused), the connection window for requests, and request bytes held in all.
    grpc_max_connections: int = 128
    grpc_max_concurrent_streams: int = 128
    grpc_connection_window: int = 128 * 1024
    grpc_max_buffered: int = 32 * 1024 * 1024
    # Nice value of the daemon's threads (-20 to 0; 0 leaves them alone), so that the
    # kubelet's calls are answered while pods start. The processes it starts, and so
    # every container, still begin at nice 0.
    daemon_nice: int = -10
    pod_shm_size: int = 64 * 1024 * 1024
    # AppArmor profile of RuntimeDefault (and unset) containers where AppArmor is on:
    # crishim-default is generated and loaded at start; another name must be loaded by
    # the administrator; "unconfined" applies none.
    apparmor_profile: str = "crishim-default"
    # CDI devices (ContainerConfig.CDI_devices, cdi.k8s.io/* annotations): false refuses
    # containers that ask for any. Spec files are read from these dirs, a later dir's
    # device definitions replacing an earlier one's.
    enable_cdi: bool = True
    cdi_spec_dirs: list[str] = field(default_factory=lambda: ["/etc/cdi", "/var/run/cdi"])
    cni: CNIConfig = field(default_factory=CNIConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    nri: NRIConfig = field(default_factory=NRIConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)

    @property
    def socket_path(self) -> str:
        return self.listen.removeprefix("unix://")

    def effective_cgroup_driver(self) -> str:
        if self.cgroup_driver:
            return self.cgroup_driver
        return "systemd" if os.path.isdir("/run/systemd/system") else "cgroupfs"

    def runtime_root(self, handler: str) -> str:
        rt = self.runtimes[handler]
        return rt.root or os.path.join(self.state, handler)

    def image_dir(self) -> str:
        """The image store's directory: `image_root`, or images/ under root."""
        return self.image_root or os.path.join(self.root, "images")

    def cni_cache_dir(self) -> str:
        return self.cni.cache_dir or os.path.join(self.root, "cni")


class ConfigError(ValueError):
    pass


def _build(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    default = cls()
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {key!r}")
        current = getattr(default, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}.{key}: expected a table")
            kwargs[key] = _build(type(current), value, f"{where}.{key}")
        elif key == "runtimes":
            if not isinstance(value, dict) or not all(isinstance(v, dict)
                                                      for v in value.values()):
                raise ConfigError(f"{where}.runtimes: expected a table of handler tables "
                                  "([runtimes.<name>] with path and root)")
            kwargs[key] = {name: _build(RuntimeHandler, spec, f"runtimes.{name}")
                           for name, spec in value.items()}
        else:
            kwargs[key] = _check_type(current, value, f"{where}.{key}")
    return cls(**kwargs)


def _check_type(default: Any, value: Any, where: str) -> Any:
    """`value` if it has the type of `default` (an int is fine for a float setting)."""
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, list):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings")
        return value
    if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value,
                                                                              type(default)):
        raise ConfigError(f"{where}: expected {type(default).__name__}, "
                          f"got {type(value).__name__}")
    return value


def load(path: str | None, overrides: dict[str, Any] | None = None) -> Config:
    """Load the file at `path` (a missing default file is fine) and apply flag overrides."""
    data: dict[str, Any] = {}
    file = path or DEFAULT_CONFIG_FILE
    try:
        with open(file, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        if path is not None:
            raise ConfigError(f"config file {file} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file}: {exc}") from None
    cfg: Config = _build(Config, data, "config")
    for key, value in (overrides or {}).items():
        if value is not None:
            setattr(cfg, key, value)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    if not cfg.listen.startswith("unix://"):
        raise ConfigError(f"listen must be unix:///path, got {cfg.listen!r}")
    if cfg.cgroup_driver not in ("", "cgroupfs", "systemd"):
        raise ConfigError(f"cgroup_driver must be cgroupfs or systemd, got {cfg.cgroup_driver!r}")
    if cfg.missing_cgroup_controller not in ("drop", "fail"):
        raise ConfigError("missing_cgroup_controller must be drop or fail, got "
                          f"{cfg.missing_cgroup_controller!r}")
    if cfg.grpc_server not in GRPC_SERVERS:
        raise ConfigError(f"grpc_server must be one of {', '.join(GRPC_SERVERS)}, got "
                          f"{cfg.grpc_server!r}")
    for key, low, high in (("grpc_max_connections", 1, 1 << 20),
                           ("grpc_max_concurrent_streams", 1, 2**31 - 1),
                           ("grpc_connection_window", 65535, 2**31 - 1),
                           ("grpc_max_buffered", 1 << 20, 1 << 40)):
        if not low <= getattr(cfg, key) <= high:
            raise ConfigError(f"{key} must be between {low} and {high}, got "
                              f"{getattr(cfg, key)!r}")
    if not -20 <= cfg.daemon_nice <= 0:
        raise ConfigError(f"daemon_nice must be between -20 and 0, got {cfg.daemon_nice!r}")
    if cfg.default_runtime not in cfg.runtimes:
        raise ConfigError(f"default_runtime {cfg.default_runtime!r} is not in [runtimes]")
    for name in ("root", "state"):
        if not Path(getattr(cfg, name)).is_absolute():
            raise ConfigError(f"{name} must be an absolute path")
    _validate_storage(cfg)
    if not cfg.apparmor_profile or any(c.isspace() for c in cfg.apparmor_profile):
        raise ConfigError("apparmor_profile must be a profile name without spaces, got "
                          f"{cfg.apparmor_profile!r}")
    for d in cfg.cdi_spec_dirs:
        if not Path(d).is_absolute():
            raise ConfigError(f"cdi_spec_dirs: {d!r} must be an absolute path")
    if cfg.registry.image_pull_progress_timeout < 0:
        raise ConfigError("registry.image_pull_progress_timeout must be >= 0 seconds "
                          "(0 disables it), got "
                          f"{cfg.registry.image_pull_progress_timeout!r}")
    if cfg.registry.max_layer_uncompressed_size < 0:
        raise ConfigError("registry.max_layer_uncompressed_size must be >= 0 bytes (0 = no "
                          f"limit), got {cfg.registry.max_layer_uncompressed_size!r}")
    for key in ("socket_path", "plugin_path", "plugin_config_path"):
        if not Path(getattr(cfg.nri, key)).is_absolute():
            raise ConfigError(f"nri.{key} must be an absolute path")
    for key in ("plugin_registration_timeout", "plugin_request_timeout"):
        if getattr(cfg.nri, key) <= 0:
            raise ConfigError(f"nri.{key} must be > 0 seconds, got {getattr(cfg.nri, key)!r}")
    if cfg.tracing.protocol not in TRACING_PROTOCOLS:
        raise ConfigError(f"tracing.protocol must be one of {', '.join(TRACING_PROTOCOLS)}, "
                          f"got {cfg.tracing.protocol!r}")
    if not 0 <= cfg.tracing.sampling_rate_per_million <= 1_000_000:
        raise ConfigError("tracing.sampling_rate_per_million must be between 0 (off) and "
                          f"1000000 (every trace), got {cfg.tracing.sampling_rate_per_million!r}")
    if not cfg.tracing.service_name:
        raise ConfigError("tracing.service_name must not be empty")
    if cfg.tracing.max_queue_size < 1:
        raise ConfigError("tracing.max_queue_size must be at least 1, got "
                          f"{cfg.tracing.max_queue_size!r}")
    if cfg.metrics.address:
        _, sep, port = cfg.metrics.address.rpartition(":")
        if not sep or not port.isdigit() or int(port) > 65535:
            raise ConfigError("metrics.address must be host:port (e.g. 127.0.0.1:9090), "
                              f"got {cfg.metrics.address!r}")


# What crishim keeps directly under root besides the image store (which may be there).
_ROOT_DIRS = ("containers", "sandboxes", "pause", "cni", "crishim.db")


def _validate_storage(cfg: Config) -> None:
    if cfg.image_root:
        if not Path(cfg.image_root).is_absolute():
            raise ConfigError("image_root must be an absolute path")
        image = os.path.normpath(cfg.image_root)
        root, state = os.path.normpath(cfg.root), os.path.normpath(cfg.state)
        clash = ("root" if image == root or _below(root, image)
                 or (_below(image, root) and _in_root_dirs(image, root))
                 else "state" if image == state or _below(image, state) or _below(state, image)
                 else "")
        if clash:
            raise ConfigError(f"image_root {cfg.image_root!r} overlaps {clash} "
                              f"{getattr(cfg, clash)!r}: give the image store a directory "
                              "of its own (docs/storage.md)")
    sizes: dict[str, int] = {}
    for key in ("container_rootfs_size", "container_rootfs_size_max"):
        text = getattr(cfg.storage, key)
        if text:
            size = parse_size(text)
            if size is None:
                raise ConfigError(f"storage.{key} must be a size such as 10Gi or 512M "
                                  f"(bytes, or Ki/Mi/Gi/Ti, k/M/G/T), got {text!r}")
            sizes[key] = size
    if sizes.get("container_rootfs_size_max", 0) and sizes.get(
            "container_rootfs_size", 0) > sizes["container_rootfs_size_max"]:
        raise ConfigError("storage.container_rootfs_size is above "
                          "storage.container_rootfs_size_max")


def _below(path: str, top: str) -> bool:
    return path.startswith(top.rstrip("/") + "/")


def _in_root_dirs(image: str, root: str) -> bool:
    """`image` (below `root`) is inside one of crishim's own dirs there."""
    return os.path.relpath(image, root).split(os.sep, 1)[0] in _ROOT_DIRS


def _toml_string(s: str) -> str:
    # TOML basic string: escape quote, backslash and every control character but tab.
    out: list[str] = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif (ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    bare = all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    return key if key and bare else _toml_string(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {type(value).__name__} as TOML")


def to_toml(cfg: Config) -> str:
    scalars: list[str] = []
    tables: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            # One level of sub-tables ([nri.default_validator]) after the table's keys.
            subs = {k: v for k, v in vars(value).items() if dataclasses.is_dataclass(v)}
            body = "".join(f"{k} = {_toml_value(v)}\n" for k, v in vars(value).items()
                           if k not in subs)
            tables.append(f"\n[{f.name}]\n{body}")
            for name, sub in subs.items():
                body = "".join(f"{k} = {_toml_value(v)}\n"
                               for k, v in dataclasses.asdict(sub).items())  # type: ignore[arg-type]
                tables.append(f"\n[{f.name}.{name}]\n{body}")
        elif f.name == "runtimes":
            for name, handler in value.items():
                body = "".join(f"{k} = {_toml_value(v)}\n"
                               for k, v in dataclasses.asdict(handler).items())
                tables.append(f"\n[runtimes.{_toml_key(name)}]\n{body}")
        else:
            scalars.append(f"{f.name} = {_toml_value(value)}\n")
    return "".join(scalars) + "".join(tables)


def as_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
