"""Attribution: which rental held which GPU when. Services flush; the request commits."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import insert, inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.errors import ApiError, Conflict, NotFound, Unprocessable, not_found
from app.customers.models import Customer
from app.customers.service import customer_by_id
from app.events.service import publish
from app.rentals import reads, repository
from app.rentals.models import GpuAssignment, Migration, Rental
from app.rentals.ports import Catalogue, RentalGpu, RentalPlan
from app.rentals.schemas import AssignmentCreate, Holding, MigrationCreate, RentalCreate


def get_rental(session: Session, rental_id: uuid.UUID, principal: Principal) -> Rental:
    rental = session.scalar(repository.readable_rentals(principal).where(Rental.id == rental_id))
    if rental is None:
        raise not_found("rental", rental_id)
    return rental


def display_name(rental: Rental, timezone: str) -> str:
    """What a person calls a rental: the name its customer gave it, else what it rents and
    when, ``1 \u00d7 H100, 2026-10-10 02:00 to 2026-10-12 02:00 CEST`` (or ``from ...``), in
    ``timezone``. The pages, the invoice document and its PDF all say this."""
    if rental.name is not None:
        return rental.name
    zone = ZoneInfo(timezone)
    start = rental.start_at.astimezone(zone)
    what = f"{rental.gpu_count} \u00d7 {rental.gpu_model}"
    if rental.end_at is None:
        return f"{what}, from {start:%Y-%m-%d %H:%M %Z}"
    return f"{what}, {start:%Y-%m-%d %H:%M} to {rental.end_at.astimezone(zone):%Y-%m-%d %H:%M %Z}"


def display_names(
    session: Session, customer_id: uuid.UUID, rental_ids: Collection[uuid.UUID], timezone: str
) -> dict[uuid.UUID, str]:
    """Each of the customer's ``rental_ids`` with its ``display_name`` (one query)."""
    if not rental_ids:
        return {}
    rentals = reads.rentals_of(session, customer_id, rental_ids)
    return {rental.id: display_name(rental, timezone) for rental in rentals}


def rental_by_id(session: Session, rental_id: uuid.UUID) -> Rental:
    """Read interface for the service's own rules (no caller to scope by): the rental."""
    return session.get_one(Rental, rental_id)


def with_assignments(session: Session, rental_ids: Collection[uuid.UUID]) -> list[Rental]:
    """Read interface (a scheduler's snapshot): these rentals, their assignments loaded, in
    two queries however many."""
    return list(repository.with_assignments(session, rental_ids))


def rentals_holding(
    session: Session, gpu_uuid: str, start: datetime, end: datetime
) -> list[uuid.UUID]:
    """Read interface: the rentals that held the GPU at some time in [start, end)."""
    return repository.rentals_holding(session, gpu_uuid, start, end)


def holdings_at(session: Session, gpu_uuids: list[str], at: datetime) -> list[Holding]:
    """Read interface (spare pool): each GPU's holder at ``at`` and its next booking."""
    return repository.holdings_at(session, gpu_uuids, at)


def customer_migrations(
    session: Session, customer_id: uuid.UUID, start: datetime, end: datetime
) -> list[Migration]:
    """Read interface: the customer's migrations that failed over in [start, end)."""
    return list(session.scalars(repository.customer_migrations_query(customer_id, start, end)))


# Checks that may refuse a new rental (raising an ApiError), registered by the composition root
# (app.wiring): e.g. budgets' hard limit, which sits above rentals and so cannot be called here.
CreateCheck = Callable[[Session, Customer], None]
_create_checks: list[CreateCheck] = []


def add_create_check(check: CreateCheck) -> None:
    """Run ``check`` before every rental is created; idempotent."""
    if check not in _create_checks:
        _create_checks.append(check)


# Checks that may refuse GPUs to rentals, registered by the composition root: e.g. the
# failover's spare reservations, which sit above rentals. Called with the GPUs' rows locked, so
# they see every assignment committed before; each answers a refusal or None per claim.
AssignCheck = Callable[[Session, Sequence[tuple[RentalGpu, Rental]]], list[ApiError | None]]
_assign_checks: list[AssignCheck] = []


def add_assign_check(check: AssignCheck) -> None:
    """Run ``check`` before GPUs are assigned to rentals; idempotent."""
    if check not in _assign_checks:
        _assign_checks.append(check)


# Where rentals look up the GPUs and plans they reference, set by the composition root.
_catalogues: list[Catalogue] = []


def use_catalogue(catalogue: Catalogue) -> None:
    _catalogues[:] = [catalogue]


def _catalogue() -> Catalogue:
    if not _catalogues:
        raise RuntimeError("no rentals catalogue: the composition root calls use_catalogue")
    return _catalogues[0]


def create_rental(session: Session, data: RentalCreate) -> Rental:
    refusal = _Terms(session).refusal(data)
    if refusal is not None:
        raise refusal
    rental = Rental(**data.model_dump())
    session.add(rental)
    session.flush()
    return rental


@dataclass(frozen=True)
class NewRental:
    """A rental to open holding these GPUs over its whole span (a scheduler's job)."""

    data: RentalCreate
    gpu_uuids: list[str]


def open_rentals(session: Session, batch: Sequence[NewRental]) -> list[Rental | ApiError]:
    """Create each rental with its GPUs by ``create_rental``'s and ``assign_gpu``'s rules, in a
    handful of statements for the whole batch (a Slurm snapshot's new jobs): each answer is
    the rental, or why it was refused, none of it written. Should the database's overlap
    trigger refuse the writes (a concurrent transaction's assignment), every rental of the
    batch is refused with its message and nothing is written: the caller asks again."""
    terms = _Terms(session)
    answers: list[Rental | ApiError] = []
    claims: list[_Claim] = []
    for item in batch:
        refusal = terms.refusal(item.data)
        if refusal is not None:
            answers.append(refusal)
            continue
        rental = Rental(id=uuid.uuid4(), **item.data.model_dump())
        answers.append(rental)
        claims += [_Claim(rental, gpu, rental.start_at, rental.end_at) for gpu in item.gpu_uuids]
    refused: dict[uuid.UUID, ApiError] = {}
    for claim, refusal in zip(claims, _refusals(session, claims), strict=True):
        if refusal is not None:
            refused.setdefault(claim.rental.id, refusal)
    answers = [refused.get(a.id, a) if isinstance(a, Rental) else a for a in answers]
    opened = [a for a in answers if isinstance(a, Rental)]
    try:
        with session.begin_nested():
            session.add_all(opened)
            session.flush()  # before their assignments, which the flush would not order after
            session.add_all(c.assignment() for c in claims if c.rental.id not in refused)
            session.flush()
    except IntegrityError as error:
        conflict = Conflict(str(error.orig).splitlines()[0], ("body", "gpu_uuid"))
        return [conflict if isinstance(a, Rental) else a for a in answers]
    return answers


class _Terms:
    """Whether a customer may rent on a plan: the customer, its create checks, the plan and
    its price, each asked once however many rentals are checked."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.customers: dict[uuid.UUID, Customer | None] = {}
        self.checked: dict[uuid.UUID, ApiError | None] = {}
        self.plans: dict[uuid.UUID, RentalPlan | None] = {}
        self.priced: dict[tuple[uuid.UUID, str, uuid.UUID, bool], bool] = {}

    def refusal(self, data: RentalCreate) -> ApiError | None:
        if data.customer_id not in self.customers:
            self.customers[data.customer_id] = customer_by_id(self.session, data.customer_id)
        customer = self.customers[data.customer_id]
        if customer is None:
            return not_found("customer", data.customer_id, ("body", "customer_id"))
        if customer.id not in self.checked:
            self.checked[customer.id] = self._create_checks(customer)
        return self.checked[customer.id] or self._plan_refusal(data, customer)

    def _create_checks(self, customer: Customer) -> ApiError | None:
        try:
            for check in _create_checks:
                check(self.session, customer)
        except ApiError as refused:
            return refused
        return None

    def _plan_refusal(self, data: RentalCreate, customer: Customer) -> ApiError | None:
        plans = _catalogue().plans
        if data.plan_id not in self.plans:
            self.plans[data.plan_id] = plans.plan(self.session, data.plan_id)
        plan = self.plans[data.plan_id]
        if plan is None:
            return not_found("price plan", data.plan_id, ("body", "plan_id"))
        if plan.currency != customer.currency:
            return Unprocessable(
                f"plan {plan.name!r} is priced in {plan.currency} but the customer is billed "
                f"in {customer.currency}",
                ("body", "plan_id"),
            )
        key = (data.plan_id, data.gpu_model, customer.id, data.preemptible)
        if key not in self.priced:
            self.priced[key] = plans.has_price(
                self.session, data.plan_id, data.gpu_model, customer.id,
                preemptible=data.preemptible,
            )  # fmt: skip
        if not self.priced[key]:
            kind = "preemptible price" if data.preemptible else "price"
            return Unprocessable(
                f"plan {plan.name!r} has no {kind} for GPU model {data.gpu_model!r}",
                ("body", "gpu_model"),
            )
        return None


def rename_rental(session: Session, rental: Rental, name: str | None) -> Rental:
    repository.rename(session, rental.id, name)
    session.refresh(rental)
    return rental


def end_rental(session: Session, rental: Rental, end_at: datetime) -> Rental:
    [answer] = end_rentals(session, [(rental, end_at)])
    if isinstance(answer, ApiError):
        raise answer
    return answer


def end_rentals(
    session: Session, endings: Sequence[tuple[Rental, datetime]]
) -> list[Rental | ApiError]:
    """End each rental at its second, its assignments open past it with it: each answer is
    the rental, or why it cannot end there (nothing of it changed). One flush for all (a
    Slurm snapshot's ended jobs); the rentals' assignments are read if not loaded."""
    answers = [_end_refusal(rental, end_at) or rental for rental, end_at in endings]
    for (rental, end_at), answer in zip(endings, answers, strict=True):
        if answer is rental:
            for assignment in rental.assignments:
                if assignment.end_at is None or assignment.end_at > end_at:
                    assignment.end_at = end_at
            rental.end_at = end_at
    session.flush()
    for rental, _ in endings:
        session.expire(rental, ["assignments"])
    return answers


def _end_refusal(rental: Rental, end_at: datetime) -> ApiError | None:
    if rental.end_at is not None:
        return Conflict(
            f"rental {rental.id} already ended at {rental.end_at.isoformat()}",
            ("path", "rental_id"),
        )
    if end_at <= rental.start_at:
        return Unprocessable(
            f"end_at must be after the rental's start {rental.start_at.isoformat()}",
            ("body", "end_at"),
        )
    for assignment in rental.assignments:
        if assignment.start_at >= end_at:
            return Conflict(
                f"assignment {assignment.id} of GPU {assignment.gpu_uuid} starts at "
                f"{assignment.start_at.isoformat()}, not before end_at; end it first",
                ("body", "end_at"),
            )
    return None


def withdraw_assignments(session: Session, rental: Rental, started_at: datetime) -> bool:
    """Delete the rental's open assignments that began at ``started_at``: a scheduler's run
    that ended in the second it began (Slurm requeued it at once) held its GPUs for no whole
    second, and an assignment cannot end where it starts. Whether any was deleted."""
    withdrawn = [a for a in rental.assignments if a.end_at is None and a.start_at == started_at]
    for assignment in withdrawn:
        session.delete(assignment)
    session.flush()
    session.expire(rental, ["assignments"])
    return bool(withdrawn)


def assign_gpu(session: Session, rental: Rental, data: AssignmentCreate) -> GpuAssignment:
    end_at = data.end_at or rental.end_at
    claim = _Claim(rental, data.gpu_uuid, data.start_at, end_at)
    _check_assignable(session, claim)
    assignment = claim.assignment()
    _flush_assignment(session, assignment)
    session.expire(rental, ["assignments"])
    return assignment


def end_assignment(
    session: Session, rental: Rental, assignment_id: int, end_at: datetime
) -> GpuAssignment:
    assignment = session.get(GpuAssignment, assignment_id)
    if assignment is None or assignment.rental_id != rental.id:
        raise not_found("assignment", assignment_id, ("path", "assignment_id"))
    if end_at <= assignment.start_at:
        raise Unprocessable(
            f"end_at must be after the assignment's start {assignment.start_at.isoformat()}",
            ("body", "end_at"),
        )
    if assignment.end_at is not None and end_at > assignment.end_at:
        raise Conflict(
            f"assignment {assignment_id} already ended at {assignment.end_at.isoformat()}",
            ("body", "end_at"),
        )
    assignment.end_at = end_at
    session.flush()
    session.expire(rental, ["assignments"])
    return assignment


def migrate(session: Session, rental: Rental, data: MigrationCreate) -> Migration:
    """Move the rental off a failed GPU: close that assignment at failed_at, open one on the
    new GPU at resumed_at, and record [failed_at, resumed_at) as the migration window."""
    old = repository.assignment_covering(session, rental.id, data.from_gpu_uuid, data.failed_at)
    if old is None or old.start_at == data.failed_at:
        raise Conflict(
            f"GPU {data.from_gpu_uuid} is not assigned to rental {rental.id} at failed_at "
            f"{data.failed_at.isoformat()}",
            ("body", "from_gpu_uuid"),
        )
    original_end, old.end_at = old.end_at, data.failed_at
    session.flush()
    if original_end is not None and data.resumed_at >= original_end:
        raise Unprocessable(
            "resumed_at is after the failed assignment would have ended", ("body", "resumed_at")
        )
    claim = _Claim(rental, data.to_gpu_uuid, data.resumed_at, original_end, "to_gpu_uuid")
    _check_assignable(session, claim)
    _flush_assignment(session, claim.assignment())
    migration = Migration(rental_id=rental.id, customer_id=rental.customer_id, **data.model_dump())
    session.add(migration)
    session.flush()
    session.expire(rental, ["assignments", "migrations"])
    _publish_migrated(session, rental, migration)
    return migration


def holder_at(session: Session, gpu_uuid: str, at: datetime) -> GpuAssignment | None:
    """Read interface: the assignment holding the GPU at ``at``, if any."""
    return repository.assignment_at(session, gpu_uuid, at)


def preemptible_seconds(
    session: Session, gpu_uuids: list[str], start: datetime, end: datetime
) -> int:
    """Read interface (spare pool view): seconds of [start, end) these GPUs were rented
    preemptibly."""
    return repository.preemptible_seconds(session, gpu_uuids, start, end)


def preempt(session: Session, rental: Rental, at: datetime, reason: str) -> Rental:
    """End a preemptible rental at ``at`` because its GPU is needed (a failover): it is never
    billed past that second, and it is an ending, not a failure credit. ``reason`` is what
    the ``rental.preempted`` event tells the rental's customer."""
    if not rental.preemptible:
        raise Conflict(f"rental {rental.id} is not preemptible", ("path", "rental_id"))
    gpus = [a.gpu_uuid for a in rental.assignments if a.end_at is None or a.end_at > at]
    end_rental(session, rental, at)
    rental.preempted_at = at
    session.flush()
    payload = {
        "rental_id": rental.id,
        "customer_id": rental.customer_id,
        "gpu_uuids": gpus,
        "preempted_at": at.isoformat(),
        "reason": reason,
    }
    publish(
        session,
        "rental.preempted",
        payload,
        subject=f"rental/{rental.id}",
        customer_id=rental.customer_id,
    )
    return rental


def _publish_migrated(session: Session, rental: Rental, migration: Migration) -> None:
    data = {
        "rental_id": rental.id,
        "migration_id": migration.id,
        "from_gpu_uuid": migration.from_gpu_uuid,
        "to_gpu_uuid": migration.to_gpu_uuid,
        "failed_at": migration.failed_at.isoformat(),
        "resumed_at": migration.resumed_at.isoformat(),
        "downtime_s": int((migration.resumed_at - migration.failed_at).total_seconds()),
        "reason": migration.reason,
    }
    subject, customer_id = f"rental/{rental.id}", rental.customer_id
    publish(session, "rental.migrated", data, subject=subject, customer_id=customer_id)


@dataclass(frozen=True)
class _Claim:
    """A GPU asked of a rental over [start, end), named by ``gpu_field`` of the request."""

    rental: Rental
    gpu_uuid: str
    start: datetime
    end: datetime | None
    gpu_field: str = "gpu_uuid"

    def assignment(self) -> GpuAssignment:
        return GpuAssignment(
            rental_id=self.rental.id, customer_id=self.rental.customer_id,
            gpu_uuid=self.gpu_uuid, start_at=self.start, end_at=self.end,
        )  # fmt: skip

    def span(self) -> _Span:
        return _Span(self.rental.id, self.start, self.end)


@dataclass(frozen=True)
class _Span:
    """A rental's hold on a GPU over [start, end): written, or granted by this check."""

    rental_id: uuid.UUID
    start: datetime
    end: datetime | None

    def overlaps(self, start: datetime, end: datetime | None) -> bool:
        return (end is None or self.start < end) and (self.end is None or start < self.end)


def _check_assignable(session: Session, claim: _Claim) -> None:
    refusal = _refusals(session, [claim])[0]
    if refusal is not None:
        raise refusal


def _refusals(session: Session, claims: Sequence[_Claim]) -> list[ApiError | None]:
    """Why each claim cannot be granted (None: it can), the GPUs' rows locked first (one
    statement for all). Each is checked against the assignments written and the claims of
    the rentals before it; a rental's claims are granted together or not at all."""
    if not claims:
        return []
    gpus = _catalogue().gpus.lock(session, {c.gpu_uuid for c in claims})
    vetoes: dict[int, ApiError] = {}
    known = [i for i, c in enumerate(claims) if c.gpu_uuid in gpus]
    for check in _assign_checks:
        answers = check(session, [(gpus[claims[i].gpu_uuid], claims[i].rental) for i in known])
        for i, veto in zip(known, answers, strict=True):
            if veto is not None:
                vetoes.setdefault(i, veto)
    ends = [c.end for c in claims]
    taken: dict[str, list[_Span]] = defaultdict(list)
    latest = None if None in ends else max(e for e in ends if e is not None)
    for a in repository.assignments_overlapping(
        session, gpus, min(c.start for c in claims), latest
    ):
        taken[a.gpu_uuid].append(_Span(a.rental_id, a.start_at, a.end_at))
    refusals: list[ApiError | None] = []
    for _, grouped in groupby(enumerate(claims), key=lambda pair: id(pair[1].rental)):
        group, granted = list(grouped), list[_Claim]()
        for i, claim in group:
            refusal = vetoes.get(i) or _refusal(session, claim, gpus.get(claim.gpu_uuid),
                                                taken[claim.gpu_uuid], granted)  # fmt: skip
            refusals.append(refusal)
            granted += [claim] if refusal is None else []
        if len(granted) == len(group):
            for claim in granted:
                taken[claim.gpu_uuid].append(claim.span())
    return refusals


def _refusal(
    session: Session,
    claim: _Claim,
    gpu: RentalGpu | None,
    taken: list[_Span],
    granted: list[_Claim],
) -> ApiError | None:
    rental, gpu_field = claim.rental, ("body", claim.gpu_field)
    if gpu is None:
        return NotFound(f"GPU {claim.gpu_uuid} not found", gpu_field)
    if gpu.in_maintenance:
        return Conflict(f"GPU {gpu.uuid} is in maintenance and cannot be assigned", gpu_field)
    if gpu.in_quarantine:
        return Conflict(
            f"GPU {gpu.uuid} is in quarantine (its node reported it; no operator admitted it "
            f"yet): admit it first, PATCH /v1/gpus/{gpu.uuid} with pool rentable",
            gpu_field,
        )
    if gpu.model != rental.gpu_model:
        return Conflict(
            f"GPU {gpu.uuid} is a {gpu.model!r}, but rental {rental.id} rents {rental.gpu_model!r}",
            gpu_field,
        )
    start, end = claim.start, claim.end
    # An open assignment of an ended rental ends with it: its start must come before that end.
    if (
        start < rental.start_at
        or (end is not None and start >= end)
        or (rental.end_at is not None and (end is None or end > rental.end_at))
    ):
        return Unprocessable(
            f"the assignment must lie within the rental [{rental.start_at.isoformat()}, "
            f"{_iso_or(rental.end_at, 'open end')})",
            ("body", "start_at"),
        )
    same_gpu = [c.span() for c in granted if c.gpu_uuid == gpu.uuid]
    overlapping = [span for span in taken + same_gpu if span.overlaps(start, end)]
    if overlapping:  # the earliest named (spans of one GPU never overlap: no tie)
        other = min(overlapping, key=lambda span: span.start)
        return Conflict(
            f"GPU {gpu.uuid} is assigned to rental {other.rental_id} from "
            f"{other.start.isoformat()} to {_iso_or(other.end, 'open end')}, "
            "which overlaps this interval",
            gpu_field,
            extra={"conflicting_rental_id": str(other.rental_id)},
        )
    held = sum(c.span().overlaps(start, end) for c in granted)
    if inspect(rental).persistent:  # a rental not yet written holds nothing else
        held += repository.concurrent_assignment_count(session, rental.id, start, end)
    if held >= rental.gpu_count:
        return Conflict(
            f"rental {rental.id} already holds {rental.gpu_count} GPU(s) in this interval",
            gpu_field,
        )
    return None


def _flush_assignment(session: Session, assignment: GpuAssignment) -> None:
    try:
        with session.begin_nested():
            session.add(assignment)
            session.flush()
    except IntegrityError as error:
        # The database trigger caught an overlap a concurrent request committed meanwhile.
        raise Conflict(str(error.orig).splitlines()[0], ("body", "gpu_uuid")) from None


def _iso_or(moment: datetime | None, otherwise: str) -> str:
    return moment.isoformat() if moment is not None else otherwise


def changed_since(
    session: Session, customer_id: uuid.UUID, start: datetime, end: datetime, since: datetime
) -> bool:
    """Whether a rental, assignment or migration of the customer overlapping [start, end) was
    created or changed after ``since`` (billing: a correction to a finalized period)."""
    return repository.changed_since(session, customer_id, start, end, since)


# The fleet simulator's bulk writer, beside the rules above (it builds fleets whole).
def insert_rentals(
    session: Session, rentals: list[dict[str, Any]], assignments: list[dict[str, Any]]
) -> None:
    """Bulk insert (thousands of rows): rentals and their assignments as column-value dicts;
    the GPU-overlap trigger still checks every assignment."""
    session.execute(insert(Rental), rentals)
    session.execute(insert(GpuAssignment), assignments)
