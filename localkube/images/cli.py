"""Build OCI images without a registry or a Docker daemon, and import them into our containerd.

    python3 localkube/images/build.py images/postgres --arg PG_VERSION=16.13 [--import]
    python3 localkube/images/build.py --ref localkube.local/base:bookworm --import
    python3 localkube/images/build.py --list

An image is a directory with an `image.json` (format: localkube/images/README.md) and a recipe
script. The result is cached as `$PGOP_CACHE/images/<name>-<tag>-<hash>.tar`, keyed by the hash of
every input (builder code, image.json, args, base packages, context files), so a warm build costs
a hash of the context and nothing else.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from localkube.common import ClusterError, Context, log
from localkube.images.builder import build
from localkube.images.containerd import import_image
from localkube.images.spec import ImageSpec, find_specs, spec_for_ref
from localkube.topology import runtime_addresses


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", help="image directory holding image.json")
    p.add_argument("--ref", help="build the image that produces this name:tag instead of naming a dir")
    p.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE", help="build argument")
    p.add_argument(
        "--import",
        dest="do_import",
        action="store_true",
        help="import into the running local cluster's containerd",
    )
    p.add_argument("--all", action="store_true", help="build every combination of the image's args")
    p.add_argument("--list", action="store_true", help="list the image specs found")
    a = p.parse_args(argv)
    try:
        if a.list:
            for spec in find_specs():
                print(f"{spec.name}:{spec.tag}\t{spec.dir}\targs={spec.args}")
            return 0
        if bool(a.dir) == bool(a.ref):
            p.error("give either an image directory or --ref")
        if a.ref:
            spec, args = spec_for_ref(a.ref)
        else:
            overrides = {}
            for item in a.arg:
                key, sep, value = item.partition("=")
                if not sep:
                    p.error(f"--arg {item!r} needs the form NAME=VALUE")
                overrides[key] = value
            spec = ImageSpec.load(Path(a.dir))
            args = spec.resolve_args(overrides)
        for variant in spec.variants() if a.all else [args]:
            tar, ref = build(spec, variant)
            print(tar)
            if a.do_import:
                for address in runtime_addresses(Context()):
                    import_image(address, tar, ref)
                log(f"imported {ref}")
    except ClusterError as e:
        print(f"localkube: error: {e}", file=sys.stderr)
        return 1
    return 0
