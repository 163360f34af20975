"""What every section needs: the engine, the config, the chosen run, and reads of the store
through its one read API (``controller.store.read``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pandas as pd
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from cliffguard.dashboard.charts import Chart
from cliffguard.dashboard.config import DashboardConfig

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Context:
    engine: Engine
    cfg: DashboardConfig
    run_id: str

    def read(self, query: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one read query in its own short session (no write lock is ever held)."""
        with Session(self.engine) as session:
            return query(session, *args, **kwargs)

    def frame(
        self, query: Callable[..., list[dict[str, Any]]], *args: Any, keys: Sequence[str], oldest_first: bool = False,
        **kwargs: Any,
    ) -> pd.DataFrame:
        """A read query's rows as a frame of ``keys`` (so an empty answer still has its columns);
        ``oldest_first`` turns a newest-first log around."""
        rows = self.read(query, *args, **kwargs)
        return pd.DataFrame(rows[::-1] if oldest_first else rows, columns=list(keys))


def show(where: Any, chart: Chart, *, key: str, **kwargs: Any) -> None:
    """Draw a ``charts.Chart`` in ``where`` (``st`` or a column) at full width, its title above."""
    if chart.title:
        where.markdown(f"**{chart.title}**")
    where.vega_lite_chart(chart.data, chart.spec, key=key, **kwargs)
