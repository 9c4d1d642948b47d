"""setuptools hook: ``pip install .`` compiles the launcher where a compiler exists.

The scripts directory gets ``runc-guard`` (launcher/runc-guard.c, the binary
containerd runs) beside ``runc-guard.py`` (the Python entry it hands over to).
Without a compiler ``runc-guard`` is a copy of the Python entry: a complete,
slower BinaryName. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from setuptools import setup

try:
    from setuptools.command.build_scripts import build_scripts
except ImportError:  # setuptools >= 70 keeps it in its vendored distutils (the shim imports it)
    from distutils.command.build_scripts import build_scripts

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildScriptsWithLauncher(build_scripts):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        target = os.path.join(self.build_dir, "runc-guard")
        try:
            subprocess.run(["sh", os.path.join(HERE, "launcher", "build.sh"), target], check=True)
        except (OSError, subprocess.CalledProcessError):
            self.announce("runc-guard: no launcher built (no compiler?): the Python entry is runc-guard", 3)
            shutil.copy2(os.path.join(self.build_dir, "runc-guard.py"), target)


setup(cmdclass={"build_scripts": BuildScriptsWithLauncher})
