from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from app.auth import service as key_service
from app.auth.models import KEY_NAME_LENGTH, KeyKind
from app.auth.service import IssuedKey, Principal
from app.core.errors import Conflict, Forbidden, Unprocessable, not_found
from app.events.service import publish
from app.fleet import repository
from app.fleet.models import Gpu, MaintenanceWindow, Node, Pool
from app.fleet.schemas import (
    GpuClaims,
    GpuCreate,
    GpuUpdate,
    HeldRead,
    MaintenanceCreate,
    NodeCreate,
    RefusedRead,
    Settlement,
    SettlementRead,
    SiteGpu,
)
from app.metering import service as metering
from app.metering.ports import Claim, LatestReport, StateChange
from app.rentals.ports import Gpus, RentalGpu
from app.rentals.service import holdings_at, rentals_holding
from app.settings import Settings


def get_node(session: Session, node_id: uuid.UUID) -> Node:
    node = session.get(Node, node_id)
    if node is None:
        raise not_found("node", node_id)
    return node


def register_node(session: Session, data: NodeCreate) -> tuple[Node, IssuedKey]:
    if repository.node_by_hostname(session, data.hostname) is not None:
        raise Conflict(
            f"a node with hostname {data.hostname!r} is already registered", ("body", "hostname")
        )
    node = Node(**data.model_dump())
    session.add(node)
    session.flush()
    return node, issue_node_token(session, node)


def enroll_node(session: Session, data: NodeCreate) -> tuple[Node, IssuedKey]:
    """Register the node, or, registered before (a restarted deployment), rotate its token."""
    node = repository.node_by_hostname(session, data.hostname)
    if node is None:
        return register_node(session, data)
    return node, issue_node_token(session, node)


def issue_node_token(session: Session, node: Node) -> IssuedKey:
    """A new agent token for the node; earlier tokens stop working (rotation)."""
    key_service.revoke_node_keys(session, node.id)
    # A label only: a 253-character hostname must not overflow the key name's column.
    name = f"agent@{node.hostname}"[:KEY_NAME_LENGTH]
    return key_service.issue_key(session, KeyKind.NODE, name, node_id=node.id)


def get_gpu(session: Session, gpu_uuid: str, principal: Principal) -> Gpu:
    """The GPU, if the caller may see it (customers: GPUs that served their rentals)."""
    gpu = session.scalar(repository.readable_gpus(principal).where(Gpu.uuid == gpu_uuid))
    if gpu is None:
        raise not_found("GPU", gpu_uuid, ("path", "gpu_uuid"))
    return gpu


def create_gpu(session: Session, data: GpuCreate) -> Gpu:
    get_node(session, data.node_id)
    if session.get(Gpu, data.uuid) is not None:
        raise Conflict(f"GPU {data.uuid} is already registered", ("body", "uuid"))
    gpu = Gpu(**data.model_dump())
    session.add(gpu)
    if gpu.pool == Pool.MAINTENANCE:
        session.add(MaintenanceWindow(gpu_uuid=gpu.uuid, start_at=datetime.now(UTC)))
    session.flush()
    return gpu


def record_maintenance(
    session: Session, gpu: Gpu, data: MaintenanceCreate
) -> tuple[MaintenanceWindow, list[uuid.UUID]]:
    """A maintenance window with explicit times, past ones included (a drain recorded after
    the fact). The rule: it may not overlap another window of the GPU (409, naming it); it
    may cover rented time, whose seconds then go to the ``maintenance`` bucket and are not
    billed, and the rentals it covers come back so the operator sees whom it affects; a
    window recorded after a period was finalized is a correction on the next invoice."""
    clash = repository.maintenance_windows(session, [gpu.uuid], data.start_at, data.end_at)
    if clash:
        other = clash[0]
        until = other.end_at.isoformat() if other.end_at else "open"
        raise Conflict(
            f"GPU {gpu.uuid} already has maintenance window {other.id} from "
            f"{other.start_at.isoformat()} to {until} overlapping it",
            ("body", "start_at"),
        )
    window = MaintenanceWindow(gpu_uuid=gpu.uuid, **data.model_dump())
    session.add(window)
    session.flush()
    return window, rentals_holding(session, gpu.uuid, data.start_at, data.end_at)


def change_pool(session: Session, gpu: Gpu, data: GpuUpdate) -> Gpu:
    """Move a GPU between pools; entering or leaving maintenance opens or closes its window."""
    now = datetime.now(UTC)
    if data.pool == Pool.MAINTENANCE and gpu.pool != Pool.MAINTENANCE:
        session.add(MaintenanceWindow(gpu_uuid=gpu.uuid, start_at=now, reason=data.reason))
    elif data.pool != Pool.MAINTENANCE and gpu.pool == Pool.MAINTENANCE:
        window = repository.open_maintenance_window(session, gpu.uuid)
        if window is not None:
            window.end_at = now
    gpu.pool = data.pool
    session.flush()
    return gpu


def gpu_site(session: Session, gpu_uuid: str) -> tuple[Gpu, Node] | None:
    """Read interface (failover): the GPU and its node (datacenter, topology group)."""
    gpu = session.get(Gpu, gpu_uuid)
    return None if gpu is None else (gpu, get_node(session, gpu.node_id))


def pool_site(session: Session, model: str, datacenter: str, at: datetime) -> list[SiteGpu]:
    """Read interface (failover): the GPUs of one model in one datacenter, with topology and
    their holder at ``at``."""
    gpus = repository.gpus_of_pool_site(session, model, datacenter)
    holdings = holdings_at(session, [gpu[0] for gpu in gpus], at)
    return [SiteGpu(*gpu, *holding) for gpu, holding in zip(gpus, holdings, strict=True)]


def gpus_in_state(session: Session, state: str, seen_since: datetime, limit: int) -> list[str]:
    """Read interface (failover's degraded check): GPUs last reported in ``state``, recently."""
    return repository.gpus_in_state(session, state, seen_since, limit)


def lock_gpu_within(session: Session, gpu_uuid: str, timeout_ms: int) -> bool:
    """Lock the GPU's row (as assigning it does), waiting at most ``timeout_ms``: False when
    another transaction kept it."""
    return repository.lock_gpu_within(session, gpu_uuid, timeout_ms)


def pool_sites(session: Session) -> list[tuple[str, str]]:
    """Read interface (spare pool view): every (datacenter, model) that has GPUs."""
    return repository.pool_sites(session)


def gpus_of_nodes(
    session: Session, hostnames: Collection[str] | None = None
) -> dict[str, list[Gpu]]:
    """Read interface (a scheduler's attribution): the GPUs of each node by hostname, for
    the nodes that exist (None: every node)."""
    return repository.gpus_of_nodes(session, hostnames)


def move_to_pool(session: Session, gpu_uuid: str, pool: Pool, reason: str) -> Gpu:
    """Move a GPU to ``pool`` by a rule (a spare taken by a failover, a repaired GPU)."""
    gpu = session.get_one(Gpu, gpu_uuid)
    return change_pool(session, gpu, GpuUpdate(pool=pool, reason=reason))


@dataclass(frozen=True)
class IngestGpus:
    """``app.metering.ports.GpuRegistry`` over the fleet's ``gpus`` table, with the admission
    policy it follows (the ``max_gpus_per_node`` and ``gpu_auto_admit`` settings, handed in by
    the composition root that wires it)."""

    max_per_node: int
    auto_admit: bool
    hold_max: int

    @classmethod
    def of(cls, settings: Settings) -> IngestGpus:
        return cls(settings.max_gpus_per_node, settings.gpu_auto_admit, settings.ingest_hold_max)

    def owners(self, session: Session, gpu_uuids: Iterable[str]) -> dict[str, uuid.UUID | None]:
        return repository.gpu_owners(session, gpu_uuids)

    def claims(
        self, session: Session, node_id: uuid.UUID, gpu_uuids: Collection[str], batch_id: str
    ) -> dict[str, Claim]:
        """Retired GPUs and GPUs settled against the node: refused. Any other GPU not the
        node's alone: in dispute (from now, for one of another node, with a ``gpu.uuid_clash``
        event), its reports held from every node until an operator settles the clash."""
        # Locked first: a clash settled meanwhile is read whole (its refused claims too).
        locked = repository.lock_gpus(session, gpu_uuids)
        refused = repository.refused_claims(session, node_id, gpu_uuids)
        claims = {}
        for gpu in locked:
            if gpu.retired_at is not None:
                claims[gpu.uuid] = Claim(False, f"GPU {gpu.uuid} was retired by an operator")
            elif gpu.uuid in refused:
                claims[gpu.uuid] = Claim(False, refused[gpu.uuid])
            elif gpu.disputed_at is not None or gpu.node_id != node_id:
                if gpu.disputed_at is None:
                    gpu.disputed_at = datetime.now(UTC)
                    _publish_clash(session, gpu, node_id, batch_id)
                claims[gpu.uuid] = Claim(True, _held_reason(gpu.uuid))
        session.flush()
        return claims

    def register(self, session: Session, node_id: uuid.UUID, models: dict[str, str]) -> None:
        """New GPUs wait in quarantine unless the policy admits them (``auto_admit``); a node
        may hold at most ``max_per_node`` (403 naming the cap)."""
        held = repository.gpu_count_of_node(session, node_id)
        if held + len(models) > self.max_per_node:
            raise Forbidden(
                f"node {node_id} has {held} GPUs and reports {len(models)} new ones: a node may "
                f"have at most {self.max_per_node} (GPUMETER_MAX_GPUS_PER_NODE)",
                ("body", "records"),
            )
        pool = Pool.RENTABLE if self.auto_admit else Pool.QUARANTINE
        repository.register_gpus(session, node_id, models, pool)

    def record_latest(self, session: Session, latest: dict[str, LatestReport]) -> list[StateChange]:
        return record_latest(session, latest)


def lock_gpus_as_ingest(session: Session, gpus: Collection[Gpu]) -> None:
    """Lock the GPUs' rows for a transaction that assigns several of them (a Slurm snapshot),
    in ingest's order: their nodes' ingest locks first (sorted, one statement), then the rows
    in UUID order. Ingest holds its nodes' locks before it touches any of their GPUs' rows,
    whose order it does not keep (a batch's own; a group commit's several nodes at once):
    taken row by row as jobs come, the two deadlocked (one answered 503)."""
    if not gpus:
        return
    metering.lock_nodes(session, {gpu.node_id for gpu in gpus})
    repository.lock_gpus(session, [gpu.uuid for gpu in gpus])


def record_latest(session: Session, latest: dict[str, LatestReport]) -> list[StateChange]:
    """Record each GPU's latest state, time, device index and minor number; the state changes
    (the port's ``record_latest``, for a caller with no admission policy to follow: the
    simulator)."""
    return repository.touch_gpus(session, latest)


def _held_reason(gpu_uuid: str) -> str:
    return (
        f"GPU {gpu_uuid} is claimed by more than one node: held until an operator settles "
        f"the clash (gpumeter gpus settle {gpu_uuid})"
    )


def _publish_clash(session: Session, gpu: Gpu, claiming: uuid.UUID, batch_id: str) -> None:
    """A ``gpu.uuid_clash`` event: an operator learns which node holds the UUID and which
    one claimed it, and that both nodes' reports of it are held until the clash is settled."""
    data = {
        "gpu_uuid": gpu.uuid,
        "registered_node_id": gpu.node_id,
        "claiming_node_id": claiming,
        "batch_id": batch_id,
    }
    publish(session, "gpu.uuid_clash", data, subject=f"gpu/{gpu.uuid}")


def held_claims(session: Session, gpu: Gpu) -> GpuClaims:
    """The GPU's dispute: the nodes whose reports of it are held, with how many."""
    held = metering.held_by_node(session, gpu.uuid)
    return GpuClaims(
        gpu_uuid=gpu.uuid,
        registered_node_id=gpu.node_id,
        disputed_at=gpu.disputed_at,
        retired_at=gpu.retired_at,
        held=[HeldRead(node_id=node, records=r, events=e) for node, r, e in held],
    )


def settle(session: Session, gpu_uuid: str, data: Settlement, gpus: IngestGpus) -> SettlementRead:
    """Settle a GPU's UUID clash: give the GPU to a node (its held reports are stored; the
    other claimants' are refused, and so are their later reports of it) or retire it (every
    held report refused, and every later one). A ``gpu.uuid_clash_settled`` event says so."""
    node = None if data.node_id is None else session.get(Node, data.node_id)
    if data.node_id is not None and node is None:
        raise Unprocessable(f"node {data.node_id} not found", ("body", "node_id"))
    if node is not None:  # its held items are stored as its batches are: its lock first
        metering.lock_node(session, node.id)
    gpu = session.get(Gpu, gpu_uuid, with_for_update=True)
    if gpu is None:
        raise not_found("GPU", gpu_uuid, ("path", "gpu_uuid"))
    claimants = {gpu.node_id, *(node for node, _, _ in metering.held_by_node(session, gpu_uuid))}
    if node is None:
        gpu.retired_at = datetime.now(UTC)
        reason = f"GPU {gpu_uuid} was retired by an operator"
    else:
        gpu.node_id, gpu.retired_at = node.id, None
        reason = (
            f"GPU {gpu_uuid} was settled to node {node.id} ({node.hostname}) by an operator; "
            "this node's reports of it are refused"
        )
        repository.accept_claim(session, gpu_uuid, node.id)
        if claimants - {node.id}:
            repository.refuse_claims(session, gpu_uuid, claimants - {node.id}, reason)
    gpu.disputed_at = None
    session.flush()
    stored, refused = metering.release_held(session, gpu_uuid, data.node_id, reason, gpus)
    settlement = SettlementRead(
        gpu_uuid=gpu_uuid,
        node_id=data.node_id,
        retired=data.node_id is None,
        stored_records=stored.accepted if stored else 0,
        duplicate_records=stored.duplicates if stored else 0,
        stored_events=stored.events_accepted if stored else 0,
        refused=[RefusedRead(**vars(refusal)) for refusal in refused],
    )
    publish(
        session,
        "gpu.uuid_clash_settled",
        settlement.model_dump(mode="json"),
        subject=f"gpu/{gpu_uuid}",
    )
    return settlement


class _RentalGpus:
    """The fleet's answers to rentals (app.rentals.ports.Gpus)."""

    def lock(self, session: Session, gpu_uuids: Collection[str]) -> dict[str, RentalGpu]:
        return {
            gpu.uuid: RentalGpu(
                gpu.uuid,
                gpu.model,
                in_maintenance=gpu.pool == Pool.MAINTENANCE,
                in_quarantine=gpu.pool == Pool.QUARANTINE,
            )
            for gpu in repository.lock_gpus(session, gpu_uuids)
        }


RENTAL_GPUS: Gpus = _RentalGpus()


def maintenance_recorded_since(
    session: Session, gpu_uuids: list[str], start: datetime, end: datetime, since: datetime
) -> bool:
    """Whether a maintenance window on these GPUs overlapping [start, end) was recorded after
    ``since`` (billing: a correction to a finalized period)."""
    windows = repository.maintenance_windows(session, gpu_uuids, start, end)
    return any(window.created_at > since for window in windows)


# The fleet simulator's bulk writer, beside the rules above (it builds fleets whole).
def insert_nodes_and_gpus(
    session: Session, nodes: list[dict[str, Any]], gpus: list[dict[str, Any]]
) -> None:
    """Bulk insert (thousands of rows): nodes and GPUs as column-value dicts."""
    session.execute(insert(Node), nodes)
    session.execute(insert(Gpu), gpus)
