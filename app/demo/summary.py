"""The demo's closing summary, read off the invoices the billing service produced."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

CREDIT_KINDS = {"failure_credit", "migration_credit", "degraded_credit", "stall_credit"}


@dataclass(frozen=True)
class PeriodSummary:
    period: str
    statuses: list[str]
    lines: list[dict[str, Any]]
    totals: Decimal

    @property
    def billed_hours(self) -> float:
        return sum(line["seconds"] or 0 for line in self._kinds({"charge"})) / 3600

    @property
    def credited_hours(self) -> float:
        return sum(line["seconds"] or 0 for line in self._kinds(CREDIT_KINDS)) / 3600

    @property
    def credited(self) -> Decimal:
        return -sum((Decimal(line["amount"]) for line in self._kinds(CREDIT_KINDS)), Decimal(0))

    def credited_on(self, gpu: str, since: int) -> Decimal:
        """Credits for one GPU's downtime from ``since`` on (the live, scripted failure)."""
        lines = self._credits_on(gpu, since)
        return -sum((Decimal(line["amount"]) for line in lines), Decimal(0))

    def credited_seconds_on(self, gpu: str, since: int) -> int:
        return sum(line["seconds"] or 0 for line in self._credits_on(gpu, since))

    def _credits_on(self, gpu: str, since: int) -> list[dict[str, Any]]:
        return [
            line
            for line in self._kinds(CREDIT_KINDS)
            if line["gpu_uuid"] == gpu and _epoch(line["end_at"]) > since
        ]

    def line(self) -> str:
        status = "/".join(sorted(set(self.statuses))) or "none"
        return (
            f"{self.period}: {len(self.statuses)} invoices ({status}), "
            f"GPU-hours billed {self.billed_hours:,.1f}, credited {self.credited_hours:,.2f} "
            f"(USD {self.credited:.2f}), invoice totals USD {self.totals:,.2f}"
        )

    def _kinds(self, kinds: set[str]) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["kind"] in kinds]


def summarise(invoices: list[dict[str, Any]], period: str) -> PeriodSummary:
    """The period's live invoices: a void one was replaced (or bills nothing), so counting it
    would bill its usage twice."""
    live = [i for i in invoices if i["status"] != "void"]
    return PeriodSummary(
        period=period,
        statuses=[i["status"] for i in live],
        lines=[line for i in live for line in i["lines"]],
        totals=sum((Decimal(i["total"]) for i in live), Decimal(0)),
    )


def _epoch(moment: str | None) -> float:
    return float("inf") if moment is None else datetime.fromisoformat(moment).timestamp()
