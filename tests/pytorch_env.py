"""The tests' second environment: transformers 5 (PyTorch only) with PyTorch CPU, where the project's saved models
are loaded as their users load them. It lives in ``.venv-pytorch`` at the project root, is made from
``tests/pytorch-requirements.txt`` on first use (about a minute here) and kept between runs; a change of the pins
makes it anew. The main environment never holds torch. ``make pytorch-env`` makes it ahead of the tests (CI makes
it on the second core while the main environment installs)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
VENV = PROJECT_ROOT / ".venv-pytorch"
REQUIREMENTS = Path(__file__).with_name("pytorch-requirements.txt")
SIDE = Path(__file__).with_name("pytorch_side.py")
STAMP = VENV / ".requirements"  # written last: an environment whose install was cut short has none


def pytorch_python() -> Path:
    """The environment's interpreter, made first where it is missing, half made or made from other pins; one
    test process makes it while the others (make test's second) wait on the lock."""
    python = VENV / "bin" / "python"
    wanted = REQUIREMENTS.read_text()
    with open(PROJECT_ROOT / ".venv-pytorch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and STAMP.exists() and STAMP.read_text() == wanted:
            return python
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
        STAMP.write_text(wanted)
        return python


def run_pytorch(request: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs ``tests/pytorch_side.py`` in the environment on ``request``; returns its JSON answer."""
    result = subprocess.run(
        [str(pytorch_python()), str(SIDE)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env={**(env or os.environ), "TOKENIZERS_PARALLELISM": "false"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


if __name__ == "__main__":
    print(pytorch_python())
