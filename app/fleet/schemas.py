from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import AfterValidator, AwareDatetime, Field, model_validator

from app.auth.schemas import IssuedKeyRead
from app.core.schemas import Schema, one_line
from app.fleet.models import Pool

GpuUuid = str
_GPU_UUID = Field(min_length=1, max_length=96, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


OneLine = AfterValidator(one_line)


class NodeCreate(Schema):
    hostname: Annotated[str, OneLine] = Field(min_length=1, max_length=253)
    datacenter: Annotated[str, OneLine] = Field(min_length=1, max_length=100)
    topology_group: Annotated[str, OneLine] | None = Field(default=None, max_length=100)


class NodeRead(Schema):
    id: UUID
    hostname: str
    datacenter: str
    topology_group: str | None
    created_at: datetime


class NodeRegistered(Schema):
    node: NodeRead
    token: IssuedKeyRead  # the agent's token, shown once


class GpuCreate(Schema):
    uuid: GpuUuid = _GPU_UUID
    node_id: UUID
    model: Annotated[str, OneLine] = Field(min_length=1, max_length=100)
    pool: Pool = Pool.RENTABLE


class GpuUpdate(Schema):
    pool: Pool
    reason: str | None = Field(
        default=None, max_length=500, description="Why, e.g. for maintenance."
    )


class MaintenanceCreate(Schema):
    start_at: AwareDatetime
    end_at: AwareDatetime
    reason: str | None = Field(default=None, max_length=500)

    @model_validator(mode="after")
    def _ends_after_start(self) -> MaintenanceCreate:
        if self.end_at <= self.start_at:
            raise ValueError("end_at must be after start_at")
        return self


class MaintenanceRead(Schema):
    id: int
    gpu_uuid: str
    start_at: datetime
    end_at: datetime | None
    reason: str | None
    created_at: datetime
    rentals: list[UUID] = Field(
        default_factory=list,
        description="Rentals that held the GPU in the window: those seconds are not billed.",
    )


class GpuRead(Schema):
    uuid: str
    node_id: UUID
    model: str
    pool: Pool
    last_state: str | None
    last_seen_at: datetime | None
    created_at: datetime
    disputed_at: datetime | None = Field(
        description="Since another node claimed its UUID: every node's reports of it are held "
        "until an operator settles the clash (POST /v1/gpus/{uuid}/settle)."
    )
    retired_at: datetime | None = Field(description="Retired: no node's reports are kept.")


class HeldRead(Schema):
    node_id: UUID
    records: int
    events: int


class GpuClaims(Schema):
    """A GPU's UUID clash: who it is registered to, and whose reports of it are held."""

    gpu_uuid: str
    registered_node_id: UUID
    disputed_at: datetime | None
    retired_at: datetime | None
    held: list[HeldRead]


class Settlement(Schema):
    node_id: UUID | None = Field(
        description="The node the GPU is on: its held reports are stored, the other "
        "claimants' refused. null: retire the GPU (every held report refused)."
    )


class RefusedRead(Schema):
    node_id: UUID
    records: int
    events: int
    reason: str


class SettlementRead(Schema):
    gpu_uuid: str
    node_id: UUID | None
    retired: bool
    stored_records: int = Field(description="Held records stored as the settled node's.")
    duplicate_records: int
    stored_events: int
    refused: list[RefusedRead] = Field(description="Held reports not stored, and why.")


@dataclass(frozen=True)
class SiteGpu:
    """A GPU of one model in one datacenter, with its node's topology and its holder at a
    time (the failover's spare pool reads these)."""

    uuid: str
    pool: str
    last_state: str | None
    node_id: UUID
    topology_group: str | None
    rental_id: UUID | None  # the rental holding it at the time asked
    rental_preemptible: bool | None
    held_since: datetime | None
    booked_from: datetime | None  # the first assignment that begins after that time
