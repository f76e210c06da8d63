"""Fetch Debian/Ubuntu packages into a cache and read their gettext catalogues, without root.

The cache is `cache_dir/debs/<package>_<version>_<arch>.deb`, exactly what `apt-get download` wrote.
It is the lock: a package present there is reused and never downloaded again, so a re-run is offline
and reproducible, and copying the .deb files into `debs/` makes the build work on machines without
apt. Catalogues are read straight out of the .deb (`dpkg-deb --fsys-tarfile`, only the
`<locale>/LC_MESSAGES/*.mo` members of the wanted locales) on every run: streaming all catalogues of
the tiny package set takes ~2 s, while unpacking them would put ~200 MB on disk.

`apt-get download` needs no root: it reads the system package lists (/var/lib/apt/lists), or private
ones under `cache_dir/apt/lists` when they exist, which a non-root user fills with
`apt_update_private` (= `apt-get -o Dir::State::Lists=... -o Dir::Cache=... update`). Downloads land
in a temporary directory and are renamed into place, so an interrupted run never leaves a partial .deb.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hybridlab.atomic import publish
from hybridlab.errors import HybridlabError

log = logging.getLogger(__name__)

_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    deb_path: Path
    size_bytes: int
    sha256: str
    downloaded: bool       # False when the .deb came from the cache


def private_apt_options(cache_dir: Path) -> list[str]:
    """apt options that point at the private lists under `cache_dir/apt`.

    Absolute paths: apt resolves a relative Dir::State::Lists against /var/lib/apt, not the cwd.
    """
    apt = Path(cache_dir).resolve() / "apt"
    return ["-o", f"Dir::State::Lists={apt / 'lists'}", "-o", f"Dir::Cache={apt / 'cache'}"]


def _private_lists_present(cache_dir: Path) -> bool:
    lists = cache_dir / "apt" / "lists"
    return lists.is_dir() and any(p.name.endswith(("Packages", "Packages.lz4", "Packages.xz", "Packages.gz"))
                                  for p in lists.iterdir())


def _apt_cmd(cache_dir: Path, private: bool) -> list[str]:
    cmd = ["apt-get"]
    if private:
        cmd += private_apt_options(cache_dir)
    if os.geteuid() == 0:
        cmd += ["-o", "APT::Sandbox::User=root"]  # root's _apt sandbox user cannot write into user dirs
    return cmd


def _update_hint(cache_dir: Path) -> str:
    apt = Path(cache_dir).resolve() / "apt"
    return (f"run `sudo apt-get update`, or without root: `mkdir -p {apt}/lists/partial {apt}/cache/archives/partial"
            f" && apt-get {' '.join(private_apt_options(cache_dir))} -o Debug::NoLocking=1 update` "
            f"(the build then uses those lists), or the CLI flag --apt-update")


def _require_tool(tool: str) -> None:
    if shutil.which(tool) is None:
        raise HybridlabError(f"`{tool}` not found: the offline corpus needs a Debian/Ubuntu machine with apt and "
                             f"dpkg, or the .deb files already placed in the cache's debs/ folder")


def apt_update_private(cache_dir: Path) -> None:
    """Fill `cache_dir/apt/lists` with package lists as an unprivileged user."""
    _require_tool("apt-get")
    apt = cache_dir / "apt"
    (apt / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    cmd = [*_apt_cmd(cache_dir, private=True), "-o", "Debug::NoLocking=1", "update"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HybridlabError(f"`{' '.join(cmd)}` failed: {_last_line(proc.stderr)}; check access to the package mirror")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no error output"


def _cached_deb(debs: Path, name: str) -> Path | None:
    found = sorted(debs.glob(f"{name}_*.deb"))
    if len(found) > 1:
        raise HybridlabError(f"several cached versions of {name} in {debs}: {', '.join(p.name for p in found)}; "
                             f"delete the stale ones")
    return found[0] if found else None


def _apt_download(names: list[str], cache_dir: Path, debs: Path) -> None:
    _require_tool("apt-get")
    cmd = [*_apt_cmd(cache_dir, private=_private_lists_present(cache_dir)), "download"]
    with tempfile.TemporaryDirectory(dir=debs, prefix=".download-") as tmp:
        proc = subprocess.run([*cmd, *names], cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            err = proc.stderr
            if "Unable to locate package" in err or "Can't find a source" in err or "no installation candidate" in err:
                missing = re.findall(r"Unable to locate package (\S+)", err)
                what = ", ".join(missing) if missing else ", ".join(names)
                raise HybridlabError(f"apt cannot find package(s) {what}: the package lists are missing or stale, "
                                     f"or the name does not exist in this distribution; {_update_hint(cache_dir)}")
            raise HybridlabError(f"apt-get download {' '.join(names)} failed: {_last_line(err)}; "
                                 f"check access to the package mirror")
        for deb in Path(tmp).glob("*.deb"):
            publish(deb, debs / deb.name)


def _deb_field(deb: Path, field: str) -> str:
    proc = subprocess.run(["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True)
    if proc.returncode != 0:
        raise HybridlabError(f"{deb} is not a readable .deb ({_last_line(proc.stderr)}); delete it from the cache")
    return proc.stdout.strip()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_packages(names: list[str], cache_dir: Path) -> list[DebPackage]:
    """Make every package's .deb present in `cache_dir/debs`; download only what is missing."""
    for name in names:
        if not _PACKAGE_RE.match(name):
            raise HybridlabError(f"invalid Debian package name {name!r} in offline packages; use names like 'vlc-l10n'")
    if len(set(names)) != len(names):
        raise HybridlabError(f"offline packages list repeats a name: {names}; list each package once")
    debs = cache_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    missing = [n for n in names if _cached_deb(debs, n) is None]
    if missing:
        start = time.perf_counter()
        _apt_download(missing, cache_dir, debs)
        size = sum(p.stat().st_size for n in missing if (p := _cached_deb(debs, n)) is not None)
        log.info("downloaded %d package(s), %.1f MB in %.1fs: %s", len(missing), size / 1e6,
                 time.perf_counter() - start, " ".join(missing))
    else:
        log.info("all %d package(s) found in %s; nothing downloaded", len(names), debs)
    _require_tool("dpkg-deb")
    packages = []
    for name in names:
        deb = _cached_deb(debs, name)
        if deb is None:
            raise HybridlabError(f"apt-get download reported success but no {name}_*.deb appeared in {debs}; "
                                 f"check that {name} is a binary package name")
        real_name, version = _deb_field(deb, "Package"), _deb_field(deb, "Version")
        if real_name != name:
            raise HybridlabError(f"{deb} holds package {real_name!r}, not {name!r}; delete it from the cache")
        packages.append(DebPackage(name, version, deb, deb.stat().st_size, _sha256(deb),
                                   downloaded=name in missing))
    return packages


def read_catalogues(deb: Path, locales: set[str] | None = None) -> list[tuple[str, str, bytes]]:
    """(locale dir name, member path, bytes) of the `<locale>/LC_MESSAGES/*.mo` files in `deb`.

    `locales` filters on the locale directory name as spelled in the package (`zh_CN`, `zh-CN`);
    None keeps all. Sorted by member path so the order never depends on the archive layout.
    """
    _require_tool("dpkg-deb")
    found = []
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|*") as tar:
            for member in tar:
                parts = member.name.split("/")
                if (member.isfile() and parts[-1].endswith(".mo") and len(parts) >= 3
                        and parts[-2] == "LC_MESSAGES" and (locales is None or parts[-3] in locales)):
                    data = tar.extractfile(member)
                    assert data is not None
                    found.append((parts[-3], member.name.lstrip("./"), data.read()))
    except tarfile.TarError as exc:
        proc.kill()
        raise HybridlabError(f"{deb} is not a readable .deb ({exc}); delete it from the cache to re-download it")
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        code = proc.wait()
    if code != 0:
        raise HybridlabError(f"dpkg-deb could not unpack {deb} ({_last_line(err)}); delete it from the cache")
    return sorted(found, key=lambda item: item[1])
