from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import Field

from app.auth.schemas import IssuedKeyRead
from app.core.schemas import Schema
from app.fleet.models import Pool

GpuUuid = str
_GPU_UUID = Field(min_length=1, max_length=96, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


class NodeCreate(Schema):
    hostname: str = Field(min_length=1, max_length=253)
    datacenter: str = Field(min_length=1, max_length=100)
    topology_group: str | None = Field(default=None, max_length=100)


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
    model: str = Field(min_length=1, max_length=100)
    pool: Pool = Pool.RENTABLE


class GpuUpdate(Schema):
    pool: Pool
    reason: str | None = Field(
        default=None, max_length=500, description="Why, e.g. for maintenance."
    )


class GpuRead(Schema):
    uuid: str
    node_id: UUID
    model: str
    pool: Pool
    last_state: str | None
    last_seen_at: datetime | None
    created_at: datetime
