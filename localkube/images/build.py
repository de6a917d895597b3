#!/usr/bin/env python3
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
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import oci  # noqa: E402
import rootfs  # noqa: E402
from common import REPO, ClusterError, Context, cache_dir, log  # noqa: E402

# Where image directories are looked up by reference: ours (pause, base) and the project's recipes.
SEARCH_DIRS = (HERE, REPO / "images")
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SKIP_NAMES = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules"}
SKIP_SUFFIXES = (".pyc", ".egg-info")
KNOWN_FIELDS = {
    "name", "tag", "base", "suite", "packages", "recipe", "context", "args", "user", "entrypoint",
    "cmd", "env", "workdir", "labels", "ports", "description",
}


@dataclass
class ImageSpec:
    """One image.json, validated."""

    dir: Path
    name: str
    tag: str
    base: str = "debian"
    suite: str = "bookworm"
    packages: list[str] = field(default_factory=list)
    recipe: Path | None = None
    context: list[str] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)
    allowed: dict[str, list[str]] = field(default_factory=dict)
    config: oci.ImageConfig = field(default_factory=oci.ImageConfig)

    @classmethod
    def load(cls, directory: Path) -> ImageSpec:
        path = directory / "image.json"
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ClusterError(f"{path}: cannot read: {e}") from None
        if not isinstance(doc, dict):
            raise ClusterError(f"{path}: must hold a JSON object")
        unknown = set(doc) - KNOWN_FIELDS
        if unknown:
            raise ClusterError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")

        def want(key: str, typ: type, default: Any = None) -> Any:
            value = doc.get(key, default)
            if value is None and default is None:
                raise ClusterError(f"{path}: field {key!r} is required")
            if not isinstance(value, typ):
                raise ClusterError(f"{path}: field {key!r} must be a {typ.__name__}")
            return value

        def str_list(key: str) -> list[str]:
            value = want(key, list, [])
            if not all(isinstance(v, str) for v in value):
                raise ClusterError(f"{path}: field {key!r} must be a list of strings")
            return list(value)

        def str_map(key: str) -> dict[str, str]:
            value = want(key, dict, {})
            if not all(isinstance(v, str) for v in value.values()):
                raise ClusterError(f"{path}: field {key!r} must map names to strings")
            return dict(value)

        args: dict[str, str] = {}
        allowed: dict[str, list[str]] = {}
        for key, value in want("args", dict, {}).items():
            values = [value] if isinstance(value, str) else value
            if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
                raise ClusterError(f"{path}: args.{key} must be a string or a non-empty list of strings")
            args[key], allowed[key] = values[0], list(values)
        base = want("base", str, "debian")
        if base not in ("debian", "scratch"):
            raise ClusterError(f"{path}: field 'base' must be \"debian\" or \"scratch\", not {base!r}")
        try:
            rel_dir = str(directory.resolve().relative_to(REPO))
        except ValueError:
            rel_dir = ""
        context = str_list("context") or ([rel_dir] if rel_dir else [])
        for entry in context:
            if entry.startswith("/") or ".." in Path(entry).parts or not (REPO / entry).exists():
                raise ClusterError(f"{path}: context entry {entry!r} must be an existing repo-relative path")
        recipe_field = doc.get("recipe", "build.sh" if (directory / "build.sh").exists() else None)
        recipe: Path | None = None
        if recipe_field is not None:
            if not isinstance(recipe_field, str):
                raise ClusterError(f"{path}: field 'recipe' must be a string")
            for candidate in (REPO / recipe_field, directory / recipe_field):
                if candidate.is_file():
                    recipe = candidate.resolve()
                    break
            else:
                raise ClusterError(f"{path}: field 'recipe' names {recipe_field!r}, which is neither a "
                                   f"repo-relative file nor a file in {directory}")
        if not doc.get("context"):
            context = _dockerignore_context(directory) or context
        return cls(
            dir=directory.resolve(),
            name=want("name", str),
            tag=want("tag", str),
            base=base,
            suite=want("suite", str, "bookworm"),
            packages=str_list("packages"),
            recipe=recipe,
            context=context,
            args=args,
            allowed=allowed,
            config=oci.ImageConfig(
                user=want("user", str, ""),
                entrypoint=str_list("entrypoint"),
                cmd=str_list("cmd"),
                env=str_map("env"),
                workdir=want("workdir", str, "/"),
                labels=str_map("labels"),
                exposed_ports=str_list("ports"),
            ),
        )

    def resolve_args(self, overrides: dict[str, str]) -> dict[str, str]:
        unknown = set(overrides) - set(self.args)
        if unknown:
            raise ClusterError(f"{self.dir}/image.json declares no arg(s) {', '.join(sorted(unknown))}; "
                               f"known: {', '.join(sorted(self.args)) or 'none'}")
        for key, value in overrides.items():
            if len(self.allowed.get(key, [])) > 1 and value not in self.allowed[key]:
                raise ClusterError(f"{self.dir}/image.json: args.{key}={value!r} is not one of "
                                   f"{', '.join(self.allowed[key])}")
        return {**self.args, **overrides}

    def variants(self) -> list[dict[str, str]]:
        """The build matrix: one args dict per combination of the listed values (images/README.md)."""
        keys = sorted(self.allowed)
        return [dict(zip(keys, combo, strict=True))
                for combo in itertools.product(*(self.allowed[k] for k in keys))] or [{}]

    def expand(self, text: str, args: dict[str, str]) -> str:
        """Replace ${NAME} with the build arg NAME (the shell/Dockerfile spelling images/ uses)."""
        def one(m: re.Match[str]) -> str:
            if m.group(1) not in args:
                raise ClusterError(f"{self.dir}/image.json uses ${{{m.group(1)}}}, which is not in 'args'")
            return args[m.group(1)]

        return VAR.sub(one, text)

    def ref(self, args: dict[str, str]) -> str:
        return f"{self.name}:{self.expand(self.tag, args)}"

    def image_config(self, args: dict[str, str]) -> oci.ImageConfig:
        c = self.config
        return oci.ImageConfig(
            user=self.expand(c.user, args),
            entrypoint=[self.expand(x, args) for x in c.entrypoint],
            cmd=[self.expand(x, args) for x in c.cmd],
            env={k: self.expand(v, args) for k, v in c.env.items()},
            workdir=self.expand(c.workdir, args),
            labels={k: self.expand(v, args) for k, v in c.labels.items()},
            exposed_ports=list(c.exposed_ports),
        )

    def args_for_tag(self, tag: str) -> dict[str, str] | None:
        """The args that make this spec's tag template produce tag, or None if it cannot."""
        pattern, names, pos = "", [], 0
        for m in VAR.finditer(self.tag):
            pattern += re.escape(self.tag[pos:m.start()]) + f"(?P<{m.group(1)}>[^:/]+)"
            names.append(m.group(1))
            pos = m.end()
        pattern += re.escape(self.tag[pos:])
        found = re.fullmatch(pattern, tag)
        if not found:
            return None
        return self.resolve_args({n: found.group(n) for n in names})


def _dockerignore_context(directory: Path) -> list[str]:
    """The context a `Dockerfile.dockerignore` of the form `*` + `!path` lines lets through."""
    ignore = directory / "Dockerfile.dockerignore"
    if not ignore.is_file():
        return []
    lines = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines or lines[0] != "*":
        return []
    keep = [ln[1:].strip("/") for ln in lines[1:] if ln.startswith("!")]
    return [k for k in keep if (REPO / k).exists()]


def find_specs() -> Iterator[ImageSpec]:
    for base in SEARCH_DIRS:
        if base.is_dir():
            for spec_file in sorted(base.glob("*/image.json")):
                yield ImageSpec.load(spec_file.parent)


def spec_for_ref(ref: str) -> tuple[ImageSpec, dict[str, str]]:
    name, _, tag = ref.rpartition(":")
    for spec in find_specs():
        if spec.name == name:
            args = spec.args_for_tag(tag)
            if args is not None:
                return spec, args
    known = ", ".join(f"{s.name}:{s.tag}" for s in find_specs())
    raise ClusterError(f"no image.json builds {ref}; known: {known}")


def _context_files(spec: ImageSpec) -> list[Path]:
    files: list[Path] = []
    for entry in spec.context:
        top = REPO / entry
        if top.is_file():
            files.append(top)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_NAMES and not d.endswith(SKIP_SUFFIXES))
            files += [Path(dirpath) / f for f in sorted(filenames) if not f.endswith(SKIP_SUFFIXES)]
    return files


def input_hash(spec: ImageSpec, args: dict[str, str]) -> str:
    h = hashlib.sha256()
    for src in sorted(HERE.glob("*.py")):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    h.update((spec.dir / "image.json").read_bytes())
    if spec.recipe is not None:
        h.update(spec.recipe.read_bytes())
    h.update(json.dumps(args, sort_keys=True).encode())
    h.update(rootfs.rootfs_key(spec.suite, spec.packages).encode())
    for f in _context_files(spec):
        mode = f.lstat().st_mode
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + oct(mode & 0o777).encode() + b"\0")
        h.update(os.readlink(f).encode() if stat.S_ISLNK(mode) else f.read_bytes())
    return h.hexdigest()[:16]


def images_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "images"


def build(spec: ImageSpec, args: dict[str, str], cache: Path | None = None,
          quiet: bool = False) -> tuple[Path, str]:
    """Build (or find cached) the image; return (OCI tar path, image reference)."""
    ref = spec.ref(args)
    out_dir = images_dir(cache)
    out_dir.mkdir(parents=True, exist_ok=True)
    short = f"{spec.name.rsplit('/', 1)[-1]}-{ref.rpartition(':')[2]}"
    tar = out_dir / f"{short}-{input_hash(spec, args)}.tar"
    logf = out_dir / "logs" / f"{short}.log"
    with (out_dir / f".lock-{short}").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tar.exists():
            return tar, ref
        for stale in out_dir.glob(f"work-{short}-*"):  # a build of this image that was killed
            _remove_work(stale)
        if not quiet:
            log(f"building image {ref} (log: {logf})")
        work = Path(tempfile.mkdtemp(prefix=f"work-{short}-", dir=out_dir))
        try:
            root = work / "rootfs"
            if spec.base == "scratch":
                root.mkdir()
                if spec.recipe:
                    env = {**os.environ, **args, "ROOTFS": str(root)}
                    _run_host_recipe(spec, env, logf)
            else:
                base = rootfs.cached_rootfs(out_dir.parent, spec.suite, spec.packages, logf)
                rootfs.copy_tree(base, root)
                if spec.recipe:
                    _copy_context(spec, root / "build")
                    recipe_rel = _recipe_in_build(spec, root / "build")
                    rootfs.run_recipe(root, recipe_rel, {**args, "BUILD_CONTEXT": "/build"}, logf)
                rootfs.clean_rootfs(root)
            oci.pack(root, ref, spec.image_config(args), tar)
        except rootfs.BuildError as e:
            raise ClusterError(str(e)) from None
        finally:
            _remove_work(work)
        for old in out_dir.glob(f"{short}-*.tar"):
            if old != tar:
                old.unlink(missing_ok=True)
    if not quiet:
        log(f"built {ref} → {tar} ({tar.stat().st_size // 1_000_000} MB)")
    return tar, ref


def _recipe_in_build(spec: ImageSpec, build_dir: Path) -> str:
    """The recipe's path relative to /build (copied there with the context, or on its own)."""
    assert spec.recipe is not None
    try:
        rel = spec.recipe.relative_to(REPO)
    except ValueError:
        rel = Path(".localkube-recipe.sh")
    if not (build_dir / rel).exists():
        (build_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.recipe, build_dir / rel)
    return str(rel)


def _run_host_recipe(spec: ImageSpec, env: dict[str, str], logf: Path) -> None:
    assert spec.recipe is not None
    logf.parent.mkdir(parents=True, exist_ok=True)
    with logf.open("ab") as f:
        res = subprocess.run(["/bin/sh", "-eu", str(spec.recipe)], cwd=spec.dir, env=env,
                             stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        raise ClusterError(f"recipe {spec.dir / spec.recipe} failed (exit {res.returncode}); log: {logf}")


def _copy_context(spec: ImageSpec, build_dir: Path) -> None:
    for f in _context_files(spec):
        dst = build_dir / f.relative_to(REPO)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if f.is_symlink():
            dst.symlink_to(os.readlink(f))
        else:
            shutil.copy2(f, dst)


def _remove_work(work: Path) -> None:
    prefix = str(work) + "/"
    with open("/proc/self/mountinfo") as mi:
        mounted = [line.split()[4] for line in mi if (line.split()[4] + "/").startswith(prefix)]
    for mnt in sorted(mounted, reverse=True):  # only if a recipe escaped its mount namespace
        subprocess.run(["umount", "-l", mnt], check=False)
    shutil.rmtree(work, ignore_errors=True)


# --- importing into containerd ---------------------------------------------------------------------


def _manifest_digest(tar: Path) -> str:
    import tarfile

    with tarfile.open(tar) as t:
        member = t.extractfile("index.json")
        assert member is not None
        return str(json.load(member)["manifests"][0]["digest"])


def imported_digest(address: str, ref: str) -> str | None:
    res = subprocess.run(["ctr", "--address", address, "-n", "k8s.io", "images", "ls", f"name=={ref}"],
                         capture_output=True, text=True)
    for line in res.stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3 and cols[0] == ref:
            return cols[2]
    return None


def import_image(address: str, tar: Path, ref: str) -> None:
    """ctr-import the OCI tar into the k8s.io namespace unless that exact image is there already."""
    if imported_digest(address, ref) == _manifest_digest(tar):
        return
    res = subprocess.run(["ctr", "--address", address, "-n", "k8s.io", "images", "import", str(tar)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterError(f"ctr image import {tar} failed: {res.stderr.strip() or res.stdout.strip()}")
    if imported_digest(address, ref) is None:
        raise ClusterError(f"ctr imported {tar} but containerd has no image named {ref}")


def ensure_images(ctx: Context, names: Sequence[str]) -> None:
    """Build (cached) and import each image reference into the running node's containerd."""
    import node  # lazily: node imports this module for the pause image

    for ref in names:
        spec, args = spec_for_ref(ref)
        tar, _ = build(spec, args, ctx.cache)
        import_image(node.containerd_address(ctx), tar, ref)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", help="image directory holding image.json")
    p.add_argument("--ref", help="build the image that produces this name:tag instead of naming a dir")
    p.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE", help="build argument")
    p.add_argument("--import", dest="do_import", action="store_true",
                   help="import into the running local cluster's containerd")
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
                import node

                import_image(node.containerd_address(Context()), tar, ref)
                log(f"imported {ref}")
    except ClusterError as e:
        print(f"localkube: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
