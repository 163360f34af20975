"""How an operator's command (status, report, nodes, alerts, badbatches, command) opens the store.

Only the controller (and the demo it runs) creates a store or changes its schema. An operator's
command opens the store that is there, as it is:

- no store there (a SQLite file that does not exist, or a database with no cliffguard schema):
  said, with where it looked; nothing is created (before, ``cliffguard status`` in the wrong
  directory left an empty ``cliffguard.db`` behind and printed "no runs");
- a schema older than this cliffguard's (a store kept from an earlier run, or one an older
  controller still writes): upgraded, as the controller would, and said on stderr with both
  revisions (before, it was upgraded without a word);
- a schema this cliffguard does not know (written by a newer one): said; not touched.

The missing and unknown cases print one line and the command exits 2.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from sqlalchemy.engine import make_url

from cliffguard.controller.store.db import Store, StoreConfig, masked_url, schema_revisions


def _sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None: not SQLite, or in memory)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database).expanduser().resolve()


def open_recorded_store(cfg: StoreConfig, prog: str) -> Store | None:
    """The store at ``cfg.url`` if it holds this cliffguard's schema; None after one line saying why not."""
    for name in ("alembic", "cliffguard.controller.store"):
        logging.getLogger(name).setLevel(logging.WARNING)
    where = masked_url(cfg.url)
    path = _sqlite_path(cfg.url)
    if path is not None and not path.is_file():
        print(f"cliffguard {prog}: no store at {path}: nothing is recorded there (the controller creates it); "
              "pass --db URL (or [store] url in --config) to read another")
        return None
    store = Store.open(cfg, migrate=False)
    try:
        current, head, known = schema_revisions(store.engine)
    except Exception as exc:  # noqa: BLE001 - a database that cannot be read: say so, exit 2
        store.close()
        print(f"cliffguard {prog}: cannot read the store at {where}: {type(exc).__name__}: {exc}")
        return None
    problem = None
    if current is None:
        problem = (f"no cliffguard store at {where} (the database holds no cliffguard schema; the controller "
                   "creates it); pass --db URL to read another")
    elif current not in known:
        problem = (f"the store at {where} has schema revision {current}, unknown to this cliffguard (written by a "
                   "newer one?): upgrade cliffguard to read it")
    if problem is not None:
        store.close()
        print(f"cliffguard {prog}: {problem}")
        return None
    if current != head:
        store.init()
        print(f"cliffguard {prog}: upgraded the store at {where} from schema revision {current} to {head} (this "
              "cliffguard's); a controller of an older version still writing it needs upgrading too",
              file=sys.stderr, flush=True)
    return store
