"""Builds of the launcher's test programs, once per session, with the one build rule."""

from __future__ import annotations

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(REPO, "launcher", "build.sh")


def parse_only(directory: str) -> str:
    """launcher/runc-guard.c built with -DPARSE_ONLY: prints its parse of argv, routes nothing."""
    out = os.path.join(directory, "parse-only")
    subprocess.run(["sh", BUILD, out, "runc-guard.py", "-DPARSE_ONLY"], check=True)
    return out


def tracer(directory: str) -> str:
    """tests/launcher/tracer.c: the runtime stand-in that records what it was started with."""
    out = os.path.join(directory, "tracer")
    src = os.path.join(REPO, "tests", "launcher", "tracer.c")
    subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", "-O2", "-o", out, src], check=True)
    return out
