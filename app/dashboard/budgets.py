"""The budgets page's forms: what a person types, read into the budgets API's own schemas.

Thresholds are typed as percent lists, one per basis ("50, 80, 100" of actual spend, "100" of
the forecast); the API's validation then says what is wrong, in the field's words.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from app.budgets.models import Budget
from app.budgets.schemas import DEFAULT_THRESHOLDS, Basis, BudgetCreate, BudgetUpdate

T = TypeVar("T")
_LABELS = {
    "amount": "Monthly amount",
    "thresholds": "Alerts",
    "rental_id": "Applies to",
    "hard_limit": "Hard limit",
}


@dataclass(frozen=True)
class BudgetForm:
    """The form's fields as typed (shown again beside the problems when refused)."""

    amount: str = ""
    rental: str = ""
    actual: str = ""
    forecast: str = ""
    hard_limit: bool = False
    problems: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, budget: Budget | None) -> BudgetForm:
        thresholds = DEFAULT_THRESHOLDS if budget is None else budget.thresholds
        dumped = [t if isinstance(t, dict) else t.model_dump(mode="json") for t in thresholds]
        return cls(
            amount="" if budget is None else f"{budget.amount:f}".rstrip("0").rstrip("."),
            rental="" if budget is None or budget.rental_id is None else str(budget.rental_id),
            actual=_percents(dumped, Basis.ACTUAL),
            forecast=_percents(dumped, Basis.FORECAST),
            hard_limit=budget is not None and budget.hard_limit,
        )

    @classmethod
    def posted(cls, form: dict[str, str]) -> BudgetForm:
        return cls(
            amount=form.get("amount", "").strip(),
            rental=form.get("rental", "").strip(),
            actual=form.get("actual", "").strip(),
            forecast=form.get("forecast", "").strip(),
            hard_limit=form.get("hard_limit") == "on",
        )

    def _fields(self) -> dict[str, object]:
        thresholds = [
            {"percent": percent, "basis": basis.value}
            for basis, typed in ((Basis.ACTUAL, self.actual), (Basis.FORECAST, self.forecast))
            for percent in re.split(r"[\s,;%]+", typed)
            if percent
        ]
        return {"amount": self.amount, "thresholds": thresholds, "hard_limit": self.hard_limit}

    def create(self) -> BudgetCreate | BudgetForm:
        """The API's create body, or this form with its problems."""
        rental = self.rental or None
        return self._read(
            lambda: BudgetCreate.model_validate({**self._fields(), "rental_id": rental})
        )

    def update(self) -> BudgetUpdate | BudgetForm:
        return self._read(lambda: BudgetUpdate.model_validate(self._fields()))

    def _read(self, build: Callable[[], T]) -> T | BudgetForm:
        try:
            return build()
        except ValidationError as error:
            problems = [_problem(e) for e in error.errors(include_url=False)]
            return BudgetForm(**{**self.__dict__, "problems": problems})


def _problem(error: Any) -> str:
    where = _LABELS.get(str(error["loc"][0]), str(error["loc"][0])) if error["loc"] else "Form"
    if error["loc"][:1] == ("thresholds",) and len(error["loc"]) > 2:
        return f"Alerts: {error['input']!r} is not a whole percent from 1 to 1000"
    return f"{where}: {error['msg']}"


def _percents(thresholds: list[dict[str, object]], basis: Basis) -> str:
    return ", ".join(str(t["percent"]) for t in thresholds if t["basis"] == basis.value)
