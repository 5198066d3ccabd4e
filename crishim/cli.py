"""Command line: `crishim` runs the daemon; `crishim config` prints the effective config."""

from __future__ import annotations

import argparse
import asyncio
import sys

from crishim import __version__, config, log
from crishim.proc import eventloop
from crishim.server import StartupError, serve


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crishim",
                                description="Kubernetes CRI v1 runtime (runc under conmon)")
    p.add_argument("--version", action="version", version=f"crishim {__version__}")
    p.add_argument("--config", help=f"TOML config file (default {config.DEFAULT_CONFIG_FILE})")
    p.add_argument("--listen", help="gRPC endpoint, unix:///path "
                   "(default unix:///run/crishim/crishim.sock)")
    p.add_argument("--root", help="persistent state dir (default /var/lib/crishim)")
    p.add_argument("--image-root", dest="image_root",
                   help="image store dir (default <root>/images)")
    p.add_argument("--state", help="volatile state dir (default /run/crishim)")
    p.add_argument("--log-level", dest="log_level",
                   help="debug, info, warning or error (default info)")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("config", help="print the effective configuration as TOML and exit")
    sub.add_parser("serve", help="run the daemon (the default)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = {"listen": args.listen, "root": args.root, "image_root": args.image_root,
                 "state": args.state, "log_level": args.log_level}
    try:
        cfg = config.load(args.config, overrides)
        log.setup(cfg.log_level)
    except (config.ConfigError, ValueError) as exc:
        print(f"crishim: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        sys.stdout.write(config.to_toml(cfg))
        return 0
    eventloop.watch_children_by_pidfd()
    try:
        return asyncio.run(serve(cfg))
    except StartupError as exc:
        print(f"crishim: {exc}", file=sys.stderr)
        return 1
