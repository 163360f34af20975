"""What every section needs: the engine, the config and the chosen run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from dashboard.charts import Chart
from dashboard.config import DashboardConfig

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Context:
    engine: Engine
    cfg: DashboardConfig
    run_id: str

    def read(self, query: Callable[..., T], *args: Any) -> T:
        """Run one read query in its own short session (no write lock is ever held)."""
        with Session(self.engine) as session:
            return query(session, *args)


def show(where: Any, chart: Chart, *, key: str, **kwargs: Any) -> None:
    """Draw a ``charts.Chart`` in ``where`` (``st`` or a column) at full width, its title above."""
    if chart.title:
        where.markdown(f"**{chart.title}**")
    where.vega_lite_chart(chart.data, chart.spec, key=key, **kwargs)
