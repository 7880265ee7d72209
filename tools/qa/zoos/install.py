"""torchvision and timm in a folder of their own (``--zoo-dir``, default in the user's cache),
never in the project's environment; see tools/qa/zoo.py's docstring for why and how to do it by
hand."""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

TIMM = "timm==1.0.31"
# what timm and torchvision import that the project's environment may lack: module -> package
SUPPORT = {
    "huggingface_hub": "huggingface_hub",
    "yaml": "pyyaml",
    "safetensors": "safetensors",
    "PIL": "pillow",
}
META = Path("torchvision") / "_meta_registrations.py"
EMPTY = '"""Emptied by tools/qa/zoo.py: the C++ ops it registers are not in this torch."""\n'
PIP_TIMEOUT_S = 600


def torchvision_pin() -> str:
    """The torchvision release built for the installed torch: 0.(minor + 15) for torch 2.minor
    (torch 2.13 -> torchvision 0.28, whose wheel asks for torch==2.13.0)."""
    minor = int(importlib.metadata.version("torch").split(".")[1])
    return f"torchvision==0.{minor + 15}.*"


def missing(zoo_dir: Path) -> list[str]:
    """The packages to install into ``zoo_dir``: torchvision and timm unless the right versions
    are there, and each support package neither the environment nor ``zoo_dir`` has."""
    wanted = []
    vision = torchvision_pin().split("==")[1].rstrip("*")
    if not list(zoo_dir.glob(f"torchvision-{vision}*.dist-info")):
        wanted.append(torchvision_pin())
    if not (zoo_dir / f"{TIMM.replace('==', '-')}.dist-info").is_dir():
        wanted.append(TIMM)
    for module, package in SUPPORT.items():
        if importlib.util.find_spec(module) is None and not (zoo_dir / module).exists():
            wanted.append(package)
    return wanted


def ensure(zoo_dir: Path) -> str | None:
    """Install what ``zoo_dir`` lacks (``pip install --no-deps --target``) and empty
    torchvision's meta registrations; None when ready, else why not, in one line."""
    zoo_dir.mkdir(parents=True, exist_ok=True)
    with open(zoo_dir / ".lock", "w") as lock:  # two sweeps at once install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = missing(zoo_dir)
        if wanted:
            failure = _pip(zoo_dir, wanted)
            if failure:
                return failure
        meta = zoo_dir / META
        if not meta.is_file():
            return f"{meta} is missing after the install"
        if meta.read_text() != EMPTY:
            meta.write_text(EMPTY)
    return None


def _pip(zoo_dir: Path, packages: list[str]) -> str | None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--upgrade",
        "--target",
        str(zoo_dir),
        *packages,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"pip install {' '.join(packages)} ran past {PIP_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")]
    first = (errors or done.stderr.strip().splitlines()[-1:] or ["no output"])[0]
    return f"pip install {' '.join(packages)} failed: {first}"
