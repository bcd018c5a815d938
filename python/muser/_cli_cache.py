"""``python -m muser cache``: where muser keeps the files it writes once and
reuses (the bench's 925 MB head), what is there, and ``--clear`` to remove it.

The folder is ``--cache-dir``, else ``$MUSER_CACHE_DIR``, else
``$XDG_CACHE_HOME/muser``, else ``~/.cache/muser``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Optional

ENV = "MUSER_CACHE_DIR"
PATTERNS = ("bench-*.gguf", "bench-*.gguf.part")  # what muser writes there: --clear removes only these


def cache_dir(override: Optional[str] = None) -> str:
    """The cache folder (not created here)."""
    if override:
        return os.path.abspath(os.path.expanduser(override))
    env = os.environ.get(ENV) or os.environ.get("MUSER_CACHE")  # MUSER_CACHE: the older name
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "muser")


def cached_files(folder: str) -> list[str]:
    return sorted({p for pat in PATTERNS for p in glob.glob(os.path.join(glob.escape(folder), pat))})


def add_cache_dir_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help=f"where muser keeps files it writes once (default ${ENV}, else ~/.cache/muser); "
                        "'python -m muser cache --clear' empties it")


def run(args: argparse.Namespace) -> int:
    folder = cache_dir(args.cache_dir)
    files = cached_files(folder)
    sizes = [os.path.getsize(f) for f in files]
    if args.clear:
        for f in files:
            os.remove(f)
        try:
            os.rmdir(folder)  # only when nothing else is left in it
        except OSError:
            pass
    if args.json:
        print(json.dumps(dict(cache_dir=folder, files=[dict(path=f, bytes=s) for f, s in zip(files, sizes)],
                              total_bytes=sum(sizes), cleared=bool(args.clear)), indent=1))
        return 0
    verb = "removed" if args.clear else "holds"
    print(f"{folder} {verb} {len(files)} file(s), {sum(sizes) / 1e6:,.1f} MB")
    for f, s in zip(files, sizes):
        print(f"  {s / 1e6:>10,.1f} MB  {os.path.basename(f)}")
    if files and not args.clear:
        print("remove with: python -m muser cache --clear" +
              (f" --cache-dir {args.cache_dir}" if args.cache_dir else ""))
    return 0


def add_parser(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser("cache", help="show (or --clear) the files muser keeps in its cache folder",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cache_dir_argument(p)
    p.add_argument("--clear", action="store_true", help="remove the files muser wrote there (bench heads)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(fn=run)
    return p


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="muser")
    add_parser(parser.add_subparsers(dest="command", required=True))
    sys.exit(run(parser.parse_args(["cache", *sys.argv[1:]])))
