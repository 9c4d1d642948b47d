"""Builds of the launcher's test programs, once per session, with the one build rule."""

from __future__ import annotations

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(REPO, "launcher", "build.sh")


def parse_only(directory: str) -> str:
    """tests/launcher/parse_only.c (launcher/runc-guard.c with a main of its own), built with the one
    build rule: prints its parse of argv, routes nothing."""
    out = os.path.join(directory, "parse-only")
    src = os.path.join(REPO, "tests", "launcher", "parse_only.c")
    subprocess.run(["sh", BUILD, out], check=True, env={**os.environ, "SRC": src})
    return out


def tracer(directory: str) -> str:
    """tests/launcher/tracer.c: the runtime stand-in that records what it was started with."""
    out = os.path.join(directory, "tracer")
    src = os.path.join(REPO, "tests", "launcher", "tracer.c")
    subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", "-O2", "-o", out, src], check=True)
    return out
