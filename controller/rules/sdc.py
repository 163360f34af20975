"""The SDC watch's verdicts: the data-parallel replicas' parameters differ (pure, no I/O).

Rank 0's step event carries ``param_check`` at every check (agent/param_check.py). A check that
disagrees is a critical verdict asking for a rollback (``Action.ROLLBACK``) to a checkpoint at or
before ``onset_step``, the last step at which every replica agreed: the state labelled that step is
the newest known clean one, and no validation can tell a corrupt replica's weights from good ones
(each rank would validate its own). The verdict names the suspect rank when a majority agreed.
Every disagreeing check is reported; the recovery machine answers the first and notes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cliffguard.controller.rules.base import STEP_EVENTS, RankScope
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import check_declared
from cliffguard.core.enums import Level
from cliffguard.core.events import Event

SDC = "sdc"
"""``Verdict.rule`` of this rule's verdicts, and the rule of their incidents."""


@dataclass(kw_only=True, slots=True)
class SdcConfig:
    enabled: bool = True
    """Answer a disagreeing parameter check with a rollback (off: the agent still logs it)."""

    def __post_init__(self) -> None:
        check_declared(self)


class SdcRule:
    name = SDC
    consumes = STEP_EVENTS
    scope = RankScope.LOSS_RANK

    def __init__(self, config: SdcConfig | None = None) -> None:
        self.config = config or SdcConfig()

    def on_event(self, event: Event) -> list[Verdict]:
        check = event.data.get("param_check")
        if not self.config.enabled or not check or check.get("agree", True):
            return []
        suspects = [int(r) for r in check.get("suspects") or ()]
        named = bool(check.get("named")) and bool(suspects)
        last = check.get("last_agreed")
        who = (f"rank {suspects[0]}" if named and len(suspects) == 1 else f"ranks {suspects}" if named else
               f"no majority among the replicas ({check.get('groups')}), so none is named")
        since = f"they last agreed at step {last}" if last is not None else "they never agreed in this process"
        return [Verdict(
            rule=SDC, level=Level.CRITICAL, step=event.step, onset_step=None if last is None else int(last),
            rank=suspects[0] if named and len(suspects) == 1 else None, action=Action.ROLLBACK,
            message=f"the data-parallel replicas' parameters differ at step {event.step}: {who}; {since}",
            evidence={"cause": SDC, **check})]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
