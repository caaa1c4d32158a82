"""Builds the package with the library inside: ``pip install
./bindings/python`` from the repository builds ``magic_sync_ffi`` in
release with cargo (minutes, once) and puts the shared library beside the
package, so the installed package needs nothing else. ``MAGIC_SYNC_LIB``
names a library built already, which is copied in instead. The rest of
the project's settings are in pyproject.toml."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

LIBRARY = {"darwin": "libmagic_sync_ffi.dylib", "win32": "magic_sync_ffi.dll"}.get(sys.platform, "libmagic_sync_ffi.so")


def library() -> Path:
    given = os.environ.get("MAGIC_SYNC_LIB")
    if given:
        return Path(given)
    # bindings/python/setup.py: the repository is two folders up.
    root = Path(__file__).resolve().parents[2]
    if not (root / "Cargo.toml").is_file():
        sys.exit("magic_sync: build from the repository (bindings/python), or set MAGIC_SYNC_LIB to a built library")
    subprocess.run(["cargo", "build", "--release", "-p", "magic_sync_ffi"], cwd=root, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    return target / "release" / LIBRARY


class WithLibrary(build_py):
    """Copies the shared library into the package as it is built."""

    def run(self) -> None:
        super().run()
        source = library()
        if not source.is_file():
            sys.exit(f"magic_sync: no library at {source}")
        shutil.copyfile(source, Path(self.build_lib) / "magic_sync" / LIBRARY)


class Native(Distribution):
    """A wheel for this platform, not for any: it carries a native library."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": WithLibrary}, distclass=Native)
