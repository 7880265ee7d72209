"""The README's first command installs Graphviz where it can and never fails where it cannot."""

from __future__ import annotations

import shutil
import subprocess

from tests.conftest import ROOT

SCRIPT = ROOT / "tools" / "install_graphviz.sh"


def test_readme_main_command_runs_it_first():
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in readme.splitlines() if "pipecompile examples/" in line)
    assert command.startswith("sh tools/install_graphviz.sh && ")


def test_without_dot_or_apt_it_says_how_and_succeeds(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "sudo"):  # what the script may call, but no dot and no apt-get
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    sh = shutil.which("sh")
    assert sh is not None
    result = subprocess.run([sh, str(SCRIPT)], env={"PATH": str(bin_dir)}, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0
    assert "pictures stay .dot files" in result.stderr


def test_with_dot_it_does_nothing(tmp_path):
    dot = tmp_path / "dot"
    dot.write_text("#!/bin/sh\nexit 0\n")
    dot.chmod(0o755)
    sh = shutil.which("sh")
    assert sh is not None
    result = subprocess.run([sh, str(SCRIPT)], env={"PATH": str(tmp_path)}, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0 and result.stderr == ""
