"""Building an image (cached by the hash of every input): a debootstrapped rootfs (rootfs.py), the
recipe run in it, packed as an OCI image-layout tar (oci.py)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from localkube.common import REPO, ClusterError, cache_dir, log
from localkube.images import oci, rootfs
from localkube.images.spec import ImageSpec, context_files

HERE = Path(__file__).resolve().parent


def input_hash(spec: ImageSpec, args: dict[str, str]) -> str:
    h = hashlib.sha256()
    # The builder's code: every .py file of localkube/images, this package (a file added here is covered).
    for src in sorted(HERE.glob("*.py")):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    h.update((spec.dir / "image.json").read_bytes())
    if spec.recipe is not None:
        h.update(spec.recipe.read_bytes())
    h.update(json.dumps(args, sort_keys=True).encode())
    h.update(rootfs.rootfs_key(spec.suite, spec.packages).encode())
    for f in context_files(spec):
        mode = f.lstat().st_mode
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + oct(mode & 0o777).encode() + b"\0")
        h.update(os.readlink(f).encode() if stat.S_ISLNK(mode) else f.read_bytes())
    return h.hexdigest()[:16]


def images_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "images"


def build(
    spec: ImageSpec, args: dict[str, str], cache: Path | None = None, quiet: bool = False
) -> tuple[Path, str]:
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
        res = subprocess.run(
            ["/bin/sh", "-eu", str(spec.recipe)],
            cwd=spec.dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    if res.returncode != 0:
        raise ClusterError(f"recipe {spec.dir / spec.recipe} failed (exit {res.returncode}); log: {logf}")


def _copy_context(spec: ImageSpec, build_dir: Path) -> None:
    for f in context_files(spec):
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
