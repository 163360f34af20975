"""One namespace, tried as a new user would: the wheel installs nothing but ``cliffguard`` (no generic
top-level ``core``, ``agent``, ``trainer``, ``controller``, ``dashboard``), and the README's plain-loop
snippet runs from a project folder that has its own ``core.py``, ``agent.py``, ``trainer.py`` and
``controller.py`` beside the script, in a fresh virtual environment, against the real broker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_readme_blocks import BLOCKS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
USER_MODULES = ("core", "agent", "trainer", "controller")
# after the snippet: the user's own modules are the ones their names import, ours came from the wheel
CHECK = """
import sys
import cliffguard.agent.hooks
import core, agent, trainer, controller
assert (core.MINE, agent.MINE, trainer.MINE, controller.MINE) == ("core", "agent", "trainer", "controller")
assert cliffguard.agent.hooks.__file__.startswith(sys.prefix), cliffguard.agent.hooks.__file__
print("namespace ok")
"""


def plain_loop_block() -> str:
    """The README's plain-loop snippet (the guarded loop without an accelerator), with its setup."""
    found = [b.setup + b.code + b.after for b in BLOCKS if b.page == "README.md"
             and "guarded_loop(" in b.code and "loop.batches(" in b.code and "accelerator" not in b.code]
    assert found, "README.md has no plain-loop block (guarded_loop + loop.batches)"
    return found[0]


def build_wheel(out: Path) -> Path:
    # from a copy of the tracked sources: setuptools writes build/ and *.egg-info beside what it builds
    src = out.parent / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                   check=True, capture_output=True, text=True, timeout=600)
    wheels = list(out.glob("cliffguard-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_has_one_top_level_name_and_the_readme_loop_runs_beside_a_users_core_py(kafka_cfg, tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"cliffguard"}, sorted(tops)
    for part in ("agent/hooks.py", "core/events.py", "controller/service.py", "dashboard/app.py", "trainer/loop.py",
                 "controller/store/migrations/env.py", "controller/store/alembic.ini"):
        assert f"cliffguard/{part}" in names, part

    # --system-site-packages: torch and the other dependencies as installed here; the wheel itself
    # goes into the venv's own site-packages, which comes first on its path
    # A PYTHONPATH reaching the repository (a developer's shell) made pip take cliffguard for installed
    # already and skip the wheel: the check below then found the checkout's code, not the wheel's.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLIFFGUARD_") and k != "PYTHONPATH"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120,
                   env=clean)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, capture_output=True, timeout=300, env=clean)

    project = tmp_path / "project"
    project.mkdir()
    for name in USER_MODULES:
        (project / f"{name}.py").write_text(f'MINE = "{name}"\n')
    script = project / "train.py"
    script.write_text(plain_loop_block() + CHECK)
    env = dict(clean)
    env.update(CLIFFGUARD_KAFKA__BOOTSTRAP=kafka_cfg.bootstrap, CLIFFGUARD_KAFKA__TOPIC_PREFIX=kafka_cfg.topic_prefix,
               CLIFFGUARD_KAFKA__PARTITIONS=str(kafka_cfg.partitions),
               CLIFFGUARD_COMMAND_SECRET="namespace-test-secret-0123456789")
    done = subprocess.run([str(python), "train.py"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "namespace ok" in done.stdout
