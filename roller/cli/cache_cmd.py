"""``roller cache info|clear``: the on-disk kernel cache (``roller.cache``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser("cache", help="show or clear the kernel cache (~/.cache/roller, $ROLLER_CACHE_DIR)",
                            description="Built kernels are cached by op, description, backend, toolchain and "
                                        "roller version. ROLLER_CACHE_DIR moves the cache; ROLLER_NO_CACHE=1 "
                                        "disables it.")
    csub = parser.add_subparsers(dest="cache_command", metavar="ACTION", parser_class=type(parser))
    parser.set_defaults(func=lambda args: _help(parser))
    p = csub.add_parser("info", help="folder, number of entries, bytes")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)
    p = csub.add_parser("clear", help="remove every kernel entry (descriptions measured here, such as --hw "
                                      "host's, stay: delete their files to measure again)")
    p.set_defaults(func=cmd_clear)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_info(args: argparse.Namespace) -> int:
    from roller import cache
    from roller.hw.loader import format_size

    doc = cache.info()
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    state = "" if doc["enabled"] else "  (disabled: ROLLER_NO_CACHE is set)"
    size = format_size(doc["bytes"]) if doc["bytes"] % 1024 == 0 else f"{doc['bytes']} B"
    print(f"dir      {doc['dir']}{state}")
    print(f"entries  {doc['entries']}")
    print(f"bytes    {doc['bytes']} ({size})")
    for path in doc["descriptions"]:   # --hw host: kept by `cache clear`, whose probe takes a minute
        print(f"hw       {path}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from roller import cache

    n = cache.clear()
    print(f"removed {n} cache entr{'y' if n == 1 else 'ies'} from {cache.cache_dir()}")
    return 0
