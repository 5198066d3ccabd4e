"""Configuration: defaults < TOML file < flags, strict keys and types, TOML round trip."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from crishim import config
from crishim.config import Config, ConfigError, RuntimeHandler


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "crishim.toml"
    path.write_text(text)
    return str(path)


def test_defaults_match_the_documented_layout() -> None:
    cfg = Config()
    assert cfg.listen == "unix:///run/crishim/crishim.sock"
    assert cfg.socket_path == "/run/crishim/crishim.sock"
    assert (cfg.root, cfg.state) == ("/var/lib/crishim", "/run/crishim")
    assert cfg.default_runtime == "runc"
    assert set(cfg.runtimes) == {"runc", "crun"}
    assert cfg.runtime_root("runc") == "/run/crishim/runc"
    assert cfg.cni.conf_dir == "/etc/cni/net.d"
    assert cfg.cni.bin_dirs == ["/opt/cni/bin", "/usr/lib/cni"]
    assert cfg.cni_cache_dir() == "/var/lib/crishim/cni"
    assert cfg.pod_shm_size == 64 * 1024 * 1024
    assert cfg.metrics.address == ""


def test_missing_default_file_gives_defaults(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setattr(config, "DEFAULT_CONFIG_FILE", str(tmp_path / "absent.toml"))
    assert config.load(None) == Config()


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(str(tmp_path / "absent.toml"))


def test_file_overrides_defaults(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, """
root = "/srv/crishim"
drain_timeout = 3
[cni]
conf_dir = "/tmp/net.d"
[runtimes.kata]
path = "/usr/bin/kata-runtime"
[runtimes.runc]
path = "/usr/sbin/runc"
root = "/run/myrunc"
"""))
    assert cfg.root == "/srv/crishim"
    assert cfg.state == "/run/crishim"  # untouched keys keep their defaults
    assert cfg.drain_timeout == 3.0 and isinstance(cfg.drain_timeout, float)
    assert cfg.cni.conf_dir == "/tmp/net.d"
    assert cfg.cni.bin_dirs == config.CNIConfig().bin_dirs
    # A [runtimes] table in the file is the complete list of handlers.
    assert cfg.runtimes == {"kata": RuntimeHandler("/usr/bin/kata-runtime", ""),
                            "runc": RuntimeHandler("/usr/sbin/runc", "/run/myrunc")}
    assert cfg.runtime_root("runc") == "/run/myrunc"
    assert cfg.runtime_root("kata") == "/run/crishim/kata"
    assert cfg.cni_cache_dir() == "/srv/crishim/cni"


def test_flags_override_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'root = "/srv/a"\nstate = "/run/a"\nlog_level = "debug"\n')
    cfg = config.load(path, {"root": "/srv/b", "state": None, "log_level": "error"})
    assert cfg.root == "/srv/b"
    assert cfg.state == "/run/a"  # a flag that was not given changes nothing
    assert cfg.log_level == "error"


@pytest.mark.parametrize("text, message", [
    ("roott = '/x'", "unknown key 'roott'"),
    ("[cni]\nconfdir = '/x'", "config.cni: unknown key 'confdir'"),
    ("[runtimes.kata]\npth = '/x'", "runtimes.kata: unknown key 'pth'"),
    ("[bogus]\nx = 1", "unknown key 'bogus'"),
])
def test_unknown_key_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.load(write(tmp_path, text))


@pytest.mark.parametrize("text, message", [
    ("drain_timeout = 'soon'", "config.drain_timeout: expected float, got str"),
    ("pod_shm_size = 1.5", "config.pod_shm_size: expected int, got float"),
    ("pod_shm_size = true", "config.pod_shm_size: expected int, got bool"),
    ("drain_timeout = true", "config.drain_timeout: expected float, got bool"),
    ("root = 5", "config.root: expected str, got int"),
    ("cni = 3", "config.cni: expected a table"),
    ("[cni]\nbin_dirs = '/opt/cni/bin'", "config.cni.bin_dirs: expected a list of strings"),
    ("[cni]\nbin_dirs = [1]", "config.cni.bin_dirs: expected a list of strings"),
    ("[streaming]\nport = '10010'", "config.streaming.port: expected int, got str"),
    ("runtimes = 'runc'", "expected a table of handler tables"),
    ("runtimes.kata = '/usr/bin/kata'", "expected a table of handler tables"),
])
def test_bad_types_are_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.load(write(tmp_path, text))


@pytest.mark.parametrize("text, message", [
    ("listen = '/run/x.sock'", "listen must be unix:///path"),
    ("cgroup_driver = 'cgroupv3'", "cgroup_driver must be cgroupfs or systemd"),
    ("default_runtime = 'kata'", "default_runtime 'kata' is not in"),
    ("[runtimes.kata]\npath = 'kata'", "default_runtime 'runc' is not in"),
    ("root = 'relative/dir'", "root must be an absolute path"),
    ("daemon_nice = 5", "daemon_nice must be between -20 and 0, got 5"),
    ("daemon_nice = -21", "daemon_nice must be between -20 and 0, got -21"),
    ("grpc_server = 'h2o'", "grpc_server must be one of grpcio, native, got 'h2o'"),
    ("[tracing]\nmax_queue_size = 0", "tracing.max_queue_size must be at least 1, got 0"),
    ("listen = ", "config file .*crishim.toml: "),  # TOML syntax error names the file
])
def test_invalid_values_are_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.load(write(tmp_path, text))


def test_invalid_flag_value_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="state must be an absolute path"):
        config.load(write(tmp_path, ""), {"state": "run/x"})


def test_effective_cgroup_driver_prefers_the_setting() -> None:
    assert Config(cgroup_driver="systemd").effective_cgroup_driver() == "systemd"
    assert Config(cgroup_driver="cgroupfs").effective_cgroup_driver() == "cgroupfs"
    assert Config().effective_cgroup_driver() in ("systemd", "cgroupfs")


def test_to_toml_round_trips_defaults(tmp_path: Path) -> None:
    text = config.to_toml(Config())
    assert config.load(write(tmp_path, text)) == Config()


def test_to_toml_round_trips_awkward_values(tmp_path: Path) -> None:
    cfg = Config(root="/srv/crï \"shim\"\\", pause_image="reg:5000/pause:3.10",
                 default_runtime="my.handler", drain_timeout=0.5)
    cfg.runtimes = {"my.handler": RuntimeHandler("/x\ny\x7f\tz", ""),
                    "runc": RuntimeHandler()}
    cfg.cni.bin_dirs = []
    cfg.streaming.port = 10010
    text = config.to_toml(cfg)
    tomllib.loads(text)  # valid TOML
    assert config.load(write(tmp_path, text)) == cfg


def test_as_dict_is_plain_data() -> None:
    d = config.as_dict(Config())
    assert d["cni"]["conf_dir"] == "/etc/cni/net.d"
    assert d["runtimes"]["runc"] == {"path": "runc", "root": ""}


def _documented_keys() -> set[str]:
    """`section.key` names from the tables in docs/configuration.md."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    keys: set[str] = set()
    section = ""
    for line in doc.splitlines():
        if line.startswith("## "):
            title = line[3:].strip().strip("`[]")
            section = "" if title == "Top-level keys" else title.split(".")[0]
        elif line.startswith("| `") and section != "Command-line flags":
            name = line.split("`")[1]
            keys.add(f"{section}.{name}" if section else name)
    return keys


def _config_keys() -> set[str]:
    keys: set[str] = set()
    for f in dataclasses.fields(Config):
        default = getattr(Config(), f.name)
        if dataclasses.is_dataclass(default):
            keys |= {f"{f.name}.{sub.name}" for sub in dataclasses.fields(default)}
        elif f.name == "runtimes":
            keys |= {f"runtimes.{sub.name}" for sub in dataclasses.fields(RuntimeHandler)}
        else:
            keys.add(f.name)
    return keys


def test_every_key_is_documented() -> None:
    # docs/configuration.md is the reference; a new setting must be added there too.
    missing = _config_keys() - _documented_keys()
    assert not missing, f"add to docs/configuration.md: {sorted(missing)}"
    stale = _documented_keys() - _config_keys()
    assert not stale, f"documented but not in crishim/config.py: {sorted(stale)}"
