from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, NamedTuple, Self

from pydantic import AfterValidator, Field, StringConstraints, model_validator

from app.core.schemas import Instant, Schema, one_line
from app.rentals.models import MAX_GPUS, NAME_MAX

# Surrounding spaces are dropped before the length is checked.
RentalName = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=NAME_MAX),
    AfterValidator(one_line),
]
_NAME_HELP = f"What you call the rental (1 to {NAME_MAX} characters, one line); pages show it."


class Holding(NamedTuple):
    """Who holds a GPU at a time, and when it is next booked (the failover's spare pool)."""

    rental_id: uuid.UUID | None
    rental_preemptible: bool | None
    held_since: datetime | None
    booked_from: datetime | None  # the first assignment that begins after that time


class _Interval(Schema):
    """[start_at, end_at); an open end (None) lasts until ended."""

    start_at: Instant
    end_at: Instant | None = None

    @model_validator(mode="after")
    def _end_after_start(self) -> Self:
        if self.end_at is not None and self.end_at <= self.start_at:
            raise ValueError(
                f"end_at {self.end_at.isoformat()} must be after {self.start_at.isoformat()}"
            )
        return self


class RentalCreate(_Interval):
    customer_id: uuid.UUID
    name: RentalName | None = Field(default=None, description=_NAME_HELP)
    plan_id: uuid.UUID
    gpu_model: str = Field(min_length=1, max_length=100)
    gpu_count: int = Field(ge=1, le=MAX_GPUS)
    preemptible: bool = Field(
        default=False,
        description="Rent idle hot spares at the plan's preemptible price; a failover that "
        "needs one ends the rental at that second (``rental.preempted``), never billed past it.",
    )


class RentalUpdate(Schema):
    """A rename: the only change a customer may make to its rental."""

    name: RentalName | None = Field(description=f"{_NAME_HELP} null clears it.")


class RentalEnd(Schema):
    end_at: Instant


class AssignmentCreate(_Interval):
    gpu_uuid: str = Field(min_length=1, max_length=96)


class AssignmentEnd(Schema):
    end_at: Instant


class MigrationCreate(Schema):
    from_gpu_uuid: str = Field(min_length=1, max_length=96)
    to_gpu_uuid: str = Field(min_length=1, max_length=96)
    failed_at: Instant
    resumed_at: Instant
    reason: str | None = Field(default=None, max_length=500)

    @model_validator(mode="after")
    def _valid_window(self) -> Self:
        if self.resumed_at < self.failed_at:
            raise ValueError(
                f"resumed_at {self.resumed_at.isoformat()} must not be before "
                f"failed_at {self.failed_at.isoformat()}"
            )
        if self.from_gpu_uuid == self.to_gpu_uuid:
            raise ValueError("from_gpu_uuid and to_gpu_uuid must be different GPUs")
        return self


class AssignmentRead(Schema):
    id: int
    rental_id: uuid.UUID
    gpu_uuid: str
    start_at: datetime
    end_at: datetime | None


class MigrationRead(Schema):
    id: int
    rental_id: uuid.UUID
    from_gpu_uuid: str
    to_gpu_uuid: str
    failed_at: datetime
    resumed_at: datetime
    reason: str | None


class RentalRead(Schema):
    id: uuid.UUID
    customer_id: uuid.UUID
    name: str | None
    plan_id: uuid.UUID
    gpu_model: str
    gpu_count: int
    start_at: datetime
    end_at: datetime | None
    preemptible: bool
    preempted_at: datetime | None
    created_at: datetime
    assignments: list[AssignmentRead]
    migrations: list[MigrationRead]
