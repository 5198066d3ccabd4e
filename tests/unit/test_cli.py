"""The `crishim` command line: config printing, flag handling and error exits."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from crishim import __version__, cli, config


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    # cli.main installs its own root handler; give pytest's back afterwards.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_config_prints_effective_toml(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "c.toml"
    file.write_text('root = "/srv/file"\n[cni]\nconf_dir = "/etc/mynet"\n')
    code, out, _ = run(["--config", str(file), "--state", "/run/flag", "config"], capsys)
    assert code == 0
    parsed = tomllib.loads(out)
    assert parsed["root"] == "/srv/file"
    assert parsed["state"] == "/run/flag"
    assert parsed["cni"]["conf_dir"] == "/etc/mynet"
    # The printed text is itself a config file that yields the same settings.
    again = tmp_path / "again.toml"
    again.write_text(out)
    assert config.load(str(again)) == config.load(str(file), {"state": "/run/flag"})


def test_all_flags_reach_the_config(tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "c.toml"
    file.write_text("")
    code, out, _ = run(["--config", str(file), "--listen", "unix:///tmp/x.sock",
                        "--root", "/srv/r", "--state", "/run/s", "--log-level", "debug",
                        "config"], capsys)
    assert code == 0
    parsed = tomllib.loads(out)
    assert (parsed["listen"], parsed["root"], parsed["state"], parsed["log_level"]) == (
        "unix:///tmp/x.sock", "/srv/r", "/run/s", "debug")


@pytest.mark.parametrize("args, message", [
    (["--listen", "tcp://0.0.0.0:1"], "listen must be unix:///path"),
    (["--log-level", "loud"], "unknown log level 'loud'"),
    (["--root", "relative"], "root must be an absolute path"),
])
def test_bad_flags_exit_2_with_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      args: list[str], message: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text("")
    code, out, err = run(["--config", str(file), *args, "config"], capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("crishim: ") and message in err


def test_bad_config_file_exits_2_naming_the_key(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[cni]\nconfdir = '/x'\n")
    code, _, err = run(["--config", str(file), "config"], capsys)
    assert code == 2
    assert "unknown key 'confdir'" in err


def test_missing_config_file_exits_2(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["--config", str(tmp_path / "nope.toml"), "config"], capsys)
    assert code == 2
    assert "does not exist" in err


def test_version_flag() -> None:
    res = subprocess.run([sys.executable, "-m", "crishim", "--version"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0
    assert res.stdout.strip() == f"crishim {__version__}"


def test_help_lists_subcommands() -> None:
    res = subprocess.run([sys.executable, "-m", "crishim", "--help"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0
    assert "config" in res.stdout and "serve" in res.stdout


def test_too_long_socket_path_is_a_clear_startup_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "c.toml"
    file.write_text("")
    sock = "/tmp/" + "s" * 110 + ".sock"
    code, _, err = run(["--config", str(file), "--listen", f"unix://{sock}",
                        "--root", str(tmp_path / "root"), "--state", str(tmp_path / "state")],
                       capsys)
    assert code == 1
    assert "unix sockets allow at most 107" in err
    assert not os.path.exists(sock)
