"""The dashboard's configuration: ``[dashboard]`` in TOML < ``CLIFFGUARD_DASHBOARD__*`` env.

``cliffguard dashboard --db URL`` passes the store URL to the Streamlit process through
``CLIFFGUARD_DASHBOARD__DB_URL`` (Streamlit owns the process's argv). The operator token also has
the project-wide name ``CLIFFGUARD_OPERATOR_TOKEN`` (what a person types to act on a run); without
it the page stays read-only and says why.

No command secret, topic or command lifetime here: the dashboard only writes unsigned requests
(``dashboard.actions``), and the controller signs them with its deployment's settings. Likewise no
spike rule: the loss bands are the statistics the controller stored (``dashboard.bands``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from cliffguard.core.declared import bounded, check_declared, non_empty
from cliffguard.core.settings import build_config, load_toml

ENV_DB_URL = "CLIFFGUARD_DASHBOARD__DB_URL"
ENV_OPERATOR_TOKEN = "CLIFFGUARD_OPERATOR_TOKEN"
ENV_CONFIG_FILE = "CLIFFGUARD_CONFIG"


@dataclass(kw_only=True, slots=True)
class DashboardConfig:
    db_url: str = non_empty("sqlite:///cliffguard.db", reason="a SQLAlchemy URL is needed")
    """SQLAlchemy URL of the controller's store (read-only; operator actions insert requests)."""
    refresh_s: float = bounded(5.0, gt=0)
    """Seconds between live updates of each section (Streamlit fragments, not whole-page reruns).
    A full pass over every section costs ~1 s of one CPU on a 100k-row store, so 5 s keeps an open
    tab cheap while still live."""
    max_points: int = bounded(20_000, ge=10)
    """Newest rank-0 step rows read for the loss curve; older history is left to store retention."""
    rank_window: int = bounded(2_000, ge=10)
    """Newest steps read for the per-rank charts (MFU, tokens/s, ratios, memory)."""
    hist_limit: int = bounded(200, ge=1)
    """Newest gradient-histogram emissions read for the heatmaps."""
    operator_token: str | None = field(default=None, repr=False)
    """Token an operator must type to act on a run; env CLIFFGUARD_OPERATOR_TOKEN also works."""
    data_report: str = ""
    """A ``cliffguard data --report`` JSON file to show on the data-quality page ("" = none)."""
    data_manifest: str = ""
    """The ``cliffguard data --out`` manifest whose curriculum and weights the page shows ("" = none)."""
    slurm_dir: str = ""
    """A ``cliffguard slurm up`` cluster's directory whose queue the queue view shows ("" = none)."""

    def __post_init__(self) -> None:
        check_declared(self)


def load_config(env: Mapping[str, str] | None = None) -> DashboardConfig:
    """Build the config from the TOML file named by CLIFFGUARD_CONFIG (if any) and the env."""
    env = os.environ if env is None else env
    toml = load_toml(env.get(ENV_CONFIG_FILE) or None)
    cfg = build_config(DashboardConfig, "dashboard", toml=toml, env=env)
    # The project-wide name fills in only what [dashboard] did not set.
    if cfg.operator_token is None and env.get(ENV_OPERATOR_TOKEN):
        cfg.operator_token = env[ENV_OPERATOR_TOKEN]
    return cfg
