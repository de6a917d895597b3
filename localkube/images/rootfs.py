"""Debian root filesystems for images: debootstrap (cached) and recipe runs inside a chroot.

Recipes run in their own mount and PID namespaces (`unshare`), so the /proc, /dev and /sys binds
vanish with the recipe's last process even if this builder is killed halfway, and no daemon a
package starts can outlive the build.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

DEFAULT_MIRROR = "http://deb.debian.org/debian"

# What a recipe may take from the host's environment. Not the CA-bundle variables (PIP_CERT,
# SSL_CERT_FILE, …): the host's bundle is copied to the standard path instead, and a recipe that
# installs ca-certificates (which rewrites that file) keeps its own copy when PIP_CERT is unset
# (images/README.md).
PASSED_ENV = (
    "PIP_DEFAULT_TIMEOUT",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class BuildError(RuntimeError):
    """An image could not be built; the message says which step and where its log is."""


def debian_mirror(suite: str = "bookworm") -> str:
    """The Debian mirror the host's apt uses (deb822 .sources first, then sources.list)."""
    candidates: list[Path] = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in candidates:
        for stanza in path.read_text(errors="replace").split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.startswith((" ", "#")):
                    fields[key.strip().lower()] = value.strip()
            uris, suites = fields.get("uris", "").split(), fields.get("suites", "").split()
            if uris and suite in suites and "deb" in fields.get("types", "deb").split():
                return uris[0]
    lists = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
            if m and m.group(2) == suite:
                return m.group(1)
    return DEFAULT_MIRROR


def rootfs_key(suite: str, packages: Sequence[str]) -> str:
    text = f"debootstrap minbase {suite} {' '.join(sorted(set(packages)))}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_rootfs(cache: Path, suite: str, packages: Sequence[str], log: Path) -> Path:
    """A debootstrapped minbase rootfs with packages, built once per (suite, package set)."""
    out = cache / "rootfs" / f"{suite}-{rootfs_key(suite, packages)}"
    if (out / ".complete").exists():
        return out
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is missing; install with: apt-get install -y debootstrap")
    tmp = out.with_name(out.name + ".tmp")
    _remove_tree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    argv = ["debootstrap", "--variant=minbase"]
    if packages:
        argv.append("--include=" + ",".join(sorted(set(packages))))
    argv += [suite, str(tmp), debian_mirror(suite)]
    _run(argv, log, f"debootstrap {suite}")
    # Package caches are not needed to build images from this rootfs; lists stay so recipes can
    # `apt-get install` without an update.
    for junk in (tmp / "var/cache/apt/archives").glob("*.deb"):
        junk.unlink()
    (tmp / ".complete").touch()
    _remove_tree(out)
    tmp.rename(out)
    return out


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a rootfs keeping owners, modes, links and device nodes (cp -a does all of it)."""
    _remove_tree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["cp", "-a", "--", str(src), str(dst)], capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"copying {src} to {dst} failed: {res.stderr.strip()}")
    (dst / ".complete").unlink(missing_ok=True)


def run_recipe(rootfs: Path, script: str, env: dict[str, str], log: Path) -> None:
    """Run /build/<script> in a chroot of rootfs with /proc, /dev and /sys available."""
    shutil.copyfile("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    bundle = rootfs / CA_BUNDLE.relative_to("/")
    own_bundle = bundle.read_bytes() if bundle.is_file() else None
    host_bundle = CA_BUNDLE.read_bytes() if CA_BUNDLE.is_file() else None
    if host_bundle is not None:
        bundle.parent.mkdir(parents=True, exist_ok=True)
        bundle.write_bytes(host_bundle)
    try:
        _chroot(rootfs, script, env, log)
    finally:
        # The host's CA bundle is for the build only: unless the recipe made its own (installing
        # ca-certificates does), the image gets back what it had.
        if host_bundle is not None and bundle.is_file() and bundle.read_bytes() == host_bundle:
            if own_bundle is None:
                bundle.unlink()
            else:
                bundle.write_bytes(own_bundle)


def _chroot(rootfs: Path, script: str, env: dict[str, str], log: Path) -> None:
    full_env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
        **{k: os.environ[k] for k in PASSED_ENV if k in os.environ},
        **env,
    }
    r = shlex.quote(str(rootfs))
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in full_env.items())
    inner = (
        f"mount -t proc proc {r}/proc && mount --bind /dev {r}/dev && mount --bind /sys {r}/sys && "
        f"{{ [ ! -d /dev/pts ] || mount --bind /dev/pts {r}/dev/pts; }} && "
        f"cd {r} && env -i {exports} chroot {r} /bin/sh -c 'cd /build && exec /bin/sh -eu ./{script}'; "
        f"rc=$?; umount {r}/dev/pts 2>/dev/null; umount {r}/sys; umount {r}/dev; umount {r}/proc; exit $rc"
    )
    argv = ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "/bin/sh", "-c", inner]
    _run(argv, log, f"recipe {script}")


def clean_rootfs(rootfs: Path) -> None:
    """Remove the build context and the caches a recipe leaves behind; the host's resolver settings
    (debootstrap and the recipe run copied them in) do not belong in an image: the kubelet mounts one."""
    resolv = rootfs / "etc/resolv.conf"
    if resolv.is_file() and not resolv.is_symlink():
        resolv.write_text("")
    build = rootfs / "build"
    if build.is_dir():
        _remove_tree(build)
    for rel in ("root/.cache", "var/cache/apt/archives", "var/lib/apt/lists", "tmp"):
        path = rootfs / rel
        if not path.is_dir() or path.is_symlink():
            continue
        for child in path.iterdir():
            if child.name in ("partial", "lock"):
                continue
            if child.is_dir() and not child.is_symlink():
                _remove_tree(child)
            else:
                child.unlink()


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        _assert_nothing_mounted(path)
        shutil.rmtree(path)


def _assert_nothing_mounted(path: Path) -> None:
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4].replace("\\040", " ")
            if (mnt + "/").startswith(prefix):
                raise BuildError(f"refusing to delete {path}: {mnt} is mounted inside it")


def _run(argv: list[str], log: Path, what: str) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as f:
        f.write(f"\n--- {what}: {' '.join(argv)}\n".encode())
        f.flush()
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        body = "\n".join(f"    {line}" for line in tail)
        raise BuildError(f"{what} failed (exit {res.returncode}); last lines of {log}:\n{body}")
