"""README.md, followed top to bottom against a real broker (issue 10: its snippet
auto-created ``events`` with one partition, so its next command failed).

Every ``oncelog`` command and the Python snippet of the README run in order,
with the broker's address put in place of 127.0.0.1:9092. Lines that hold a
placeholder for something a real deployment would have (a transactional id,
the start offset of a hanging transaction) are skipped, and so is kcat.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(240)

README = Path(__file__).resolve().parents[2] / "README.md"
PLACEHOLDERS = ("txns describe my-txn-id", "txns abort ")


def readme_steps() -> list[tuple[str, str]]:
    """("sh", command) and ("python", code) in README order, from the fenced blocks."""
    steps: list[tuple[str, str]] = []
    for lang, body in re.findall(r"```(sh|python)\n(.*?)```", README.read_text(), re.S):
        if lang == "python":
            steps.append(("python", body))
            continue
        for line in body.splitlines():
            line = re.sub(r"\[([^\]]*)\]", r"\1", line.split("  #")[0].strip())  # [--optional flags] given
            if line.startswith(".venv/bin/oncelog ") and not any(p in line for p in PLACEHOLDERS):
                steps.append(("sh", line))
    return steps


def test_readme_top_to_bottom(tmp_path: Path) -> None:
    steps = readme_steps()
    assert any("topics create events" in s for _k, s in steps) and any(k == "python" for k, _s in steps)
    with EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log") as b:
        for kind, step in steps:
            step = step.replace("127.0.0.1:9092", b.bootstrap)
            if kind == "python":
                r = subprocess.run([sys.executable, "-c", step.replace('"group.id": "g",',
                                                                       '"group.id": "g", "log_level": 0,')],
                                   capture_output=True, text=True, timeout=90)
            else:
                args = shlex.split(step)[1:]
                if "--bootstrap" not in args:
                    args += ["--bootstrap", b.bootstrap]
                r = subprocess.run([sys.executable, "-m", "oncelog.cli", *args], capture_output=True, text=True,
                                   timeout=90)
            assert r.returncode == 0, f"README step failed: {step}\n{r.stdout}\n{r.stderr}"
