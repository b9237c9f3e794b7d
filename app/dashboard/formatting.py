"""How the dashboard and the PDF write money, durations and times for one customer.

Money stays ``Decimal`` to the last character: amounts are shown at the currency's minor unit
(rounded with the billing rounding only if an input ever carries more places).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from zoneinfo import ZoneInfo

from app.core.epoch import from_epoch
from app.core.money import display


@dataclass(frozen=True)
class Formatter:
    currency: str
    timezone: str

    def money(self, amount: Decimal | str) -> str:
        return display(amount, self.currency)

    def local(self, moment: dt.datetime | int) -> dt.datetime:
        if isinstance(moment, int):
            moment = from_epoch(moment)
        return moment.astimezone(ZoneInfo(self.timezone))

    def datetime(self, moment: dt.datetime | int) -> str:
        return self.local(moment).strftime("%Y-%m-%d %H:%M %Z")

    def datetime_s(self, moment: dt.datetime | int) -> str:
        return self.local(moment).strftime("%Y-%m-%d %H:%M:%S %Z")

    def date(self, moment: dt.datetime | int) -> str:
        return self.local(moment).strftime("%Y-%m-%d")


def hours(seconds: int | float) -> str:
    """GPU-hours with two decimals (display only; billing never uses this)."""
    return f"{seconds / 3600:,.2f}"


def duration(seconds: int) -> str:
    minutes, s = divmod(int(seconds), 60)
    h, m = divmod(minutes, 60)
    if h >= 48:
        return f"{h // 24} d {h % 24} h"
    if h:
        return f"{h} h {m:02d} min"
    return f"{m} min {s:02d} s" if m else f"{s} s"
