"""The one namespace: the repository keeps the design's parts at its root (agent/, controller/, ...),
and the wheel installs each of them under ``cliffguard.`` (``cliffguard.agent``, ...), so no generic
top-level name (``core``, ``agent``, ``trainer``) can collide with a user's own module.

setuptools' ``package_dir`` does the mapping (both for the wheel and for ``pip install -e``, whose
finder maps each part to its folder); pyproject.toml cannot list packages computed from the folders,
which is all this file does.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
# the importable part -> its folder in the repository
PARTS = {"cliffguard": "cliffguard", "cliffguard.core": "core", "cliffguard.agent": "agent",
         "cliffguard.trainer": "trainer", "cliffguard.controller": "controller", "cliffguard.dashboard": "dashboard"}


def _packages() -> list[str]:
    out: list[str] = []
    for name, folder in PARTS.items():
        out.append(name)
        out += [f"{name}.{sub}" for sub in find_packages(str(ROOT / folder))]
    return out


setup(packages=_packages(), package_dir=PARTS)
