from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import ColumnElement, Select, exists, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from app.core.db import none_of, one_of
from app.slurm.models import ActionKind, SlurmAccount, SlurmAction, SlurmJob


def accounts_query() -> Select[SlurmAccount]:
    return select(SlurmAccount).order_by(SlurmAccount.account)


def accounts(session: Session, names: Collection[str]) -> dict[str, SlurmAccount]:
    rows = session.scalars(select(SlurmAccount).where(one_of(SlurmAccount.account, names)))
    return {row.account: row for row in rows}


def upsert_account(
    session: Session, account: str, customer_id: uuid.UUID, plan_id: uuid.UUID
) -> SlurmAccount:
    values = {"account": account, "customer_id": customer_id, "plan_id": plan_id}
    statement = insert(SlurmAccount).values(values)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[SlurmAccount.account],
            set_={"customer_id": customer_id, "plan_id": plan_id},
        )
    )
    return session.get_one(SlurmAccount, account, populate_existing=True)


def plan_for_each_snapshot(session: Session) -> None:
    """Postgres plans each statement of this transaction for its own arguments. A
    snapshot's job-id arrays run from ten ids to the whole table, and psycopg prepares a
    statement run five times: a plan made generic from the small rounds cannot hash the
    array, so the whole listing's 10,000 ids were searched one by one for each row
    (2 s a statement, where its own plan takes milliseconds)."""
    session.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))


class SeenJob(NamedTuple):
    """What a snapshot compares with each job it lists: a row, not an entity (a whole
    listing reads 10,000 of them)."""

    rental_id: uuid.UUID | None
    problem: str | None
    state: str
    restarts: int
    run_start_at: datetime | None
    nodes: list[str]
    ended_at: datetime | None


def jobs(session: Session, cluster: str, job_ids: Collection[int]) -> dict[int, SeenJob]:
    """The cluster's known jobs among these, as they are now (not locked)."""
    columns = [getattr(SlurmJob, name) for name in SeenJob._fields]
    rows = session.execute(
        select(SlurmJob.job_id, *columns).where(
            SlurmJob.cluster == cluster, one_of(SlurmJob.job_id, job_ids)
        )
    )
    return {row[0]: SeenJob(*row[1:]) for row in rows}


def locked_jobs(session: Session, cluster: str, job_ids: Collection[int]) -> dict[int, SlurmJob]:
    """The cluster's known jobs among these, locked in job order (two snapshots of one cluster
    take them one after the other, never crosswise), read again under the lock."""
    if not job_ids:
        return {}
    rows = session.scalars(
        select(SlurmJob)
        .where(SlurmJob.cluster == cluster, one_of(SlurmJob.job_id, job_ids))
        .order_by(SlurmJob.job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return {row.job_id: row for row in rows}


def touch_seen(
    session: Session, cluster: str, job_ids: Collection[int], now: datetime, step: timedelta
) -> None:
    """Open jobs among these, last seen ``step`` or longer before ``now``, seen at ``now``."""
    if job_ids:
        session.execute(
            update(SlurmJob)
            .where(
                SlurmJob.cluster == cluster,
                one_of(SlurmJob.job_id, job_ids),
                SlurmJob.ended_at.is_(None),
                SlurmJob.last_seen_at <= now - step,
            )
            .values(last_seen_at=now)
            .execution_options(synchronize_session=False)
        )


def _open(cluster: str, among: ColumnElement[bool]) -> Select[SlurmJob]:
    """The cluster's attributed jobs not yet ended, ``among`` these, in job order."""
    return (
        select(SlurmJob)
        .where(
            SlurmJob.cluster == cluster,
            SlurmJob.rental_id.is_not(None),
            SlurmJob.ended_at.is_(None),
            among,
        )
        .order_by(SlurmJob.job_id)
    )


def open_jobs_missing(session: Session, cluster: str, seen: Collection[int]) -> list[SlurmJob]:
    """Attributed jobs not yet ended that a complete snapshot no longer lists, locked."""
    query = _open(cluster, none_of(SlurmJob.job_id, seen)).with_for_update()
    return list(session.scalars(query))


def open_job_ids(session: Session, cluster: str, job_ids: Collection[int]) -> list[int]:
    """Attributed jobs not yet ended among these."""
    if not job_ids:
        return []
    return _open_ids(session, cluster, one_of(SlurmJob.job_id, job_ids))


def open_job_ids_missing(session: Session, cluster: str, seen: Collection[int]) -> list[int]:
    """Attributed jobs not yet ended that a snapshot did not list."""
    return _open_ids(session, cluster, none_of(SlurmJob.job_id, seen))


def _open_ids(session: Session, cluster: str, among: ColumnElement[bool]) -> list[int]:
    return list(session.scalars(_open(cluster, among).with_only_columns(SlurmJob.job_id)))


def job_of_rental(session: Session, rental_id: uuid.UUID) -> SlurmJob | None:
    return session.scalar(select(SlurmJob).where(SlurmJob.rental_id == rental_id))


def jobs_query(cluster: str | None) -> Select[SlurmJob]:
    query = select(SlurmJob).order_by(SlurmJob.cluster, SlurmJob.job_id)
    return query if cluster is None else query.where(SlurmJob.cluster == cluster)


def add_action(session: Session, action: SlurmAction) -> bool:
    """Record the action unless its unique key (one per failover, one open repair per node)
    says it is recorded already (an event handled twice)."""
    try:
        with session.begin_nested():
            session.add(action)
            session.flush()
    except IntegrityError:
        if action in session:
            session.expunge(action)
        return False
    return True


def pending_actions_query(cluster: str) -> Select[SlurmAction]:
    return (
        select(SlurmAction)
        .where(SlurmAction.cluster == cluster, SlurmAction.done_at.is_(None))
        .order_by(SlurmAction.id)
    )


def locked_action(session: Session, action_id: int) -> SlurmAction | None:
    return session.scalar(select(SlurmAction).where(SlurmAction.id == action_id).with_for_update())


def last_failover_action_on_node(session: Session, node: str) -> SlurmAction | None:
    """The latest failover that drained this node, if gpumeter drained it at all."""
    return session.scalar(
        select(SlurmAction)
        .where(SlurmAction.kind == ActionKind.FAILOVER, SlurmAction.node == node)
        .order_by(SlurmAction.id.desc())
        .limit(1)
    )


def repaired_since(session: Session, drained: SlurmAction) -> bool:
    """Whether a repair of the drained node was asked for after that drain."""
    found = session.scalar(
        select(SlurmAction.id).where(
            SlurmAction.cluster == drained.cluster,
            SlurmAction.kind == ActionKind.REPAIR,
            SlurmAction.node == drained.node,
            SlurmAction.id > drained.id,
        )
    )
    return found is not None


def held_drained_nodes(session: Session) -> list[str]:
    """Nodes whose last failover action is done (the node drained) with no repair since."""
    last = (
        select(SlurmAction.cluster, SlurmAction.node, func.max(SlurmAction.id).label("id"))
        .where(SlurmAction.kind == ActionKind.FAILOVER)
        .group_by(SlurmAction.cluster, SlurmAction.node)
        .subquery()
    )
    later = aliased(SlurmAction)
    repair = select(later.id).where(
        later.kind == ActionKind.REPAIR,
        later.cluster == last.c.cluster,
        later.node == last.c.node,
        later.id > last.c.id,
    )
    query = (
        select(last.c.node)
        .join(SlurmAction, SlurmAction.id == last.c.id)
        .where(SlurmAction.done_at.is_not(None), ~exists(repair))
        .order_by(last.c.node)
    )
    return list(session.scalars(query))


def last_repair_action_on_node(session: Session, cluster: str, node: str) -> SlurmAction:
    return session.scalars(
        select(SlurmAction)
        .where(
            SlurmAction.cluster == cluster,
            SlurmAction.kind == ActionKind.REPAIR,
            SlurmAction.node == node,
        )
        .order_by(SlurmAction.id.desc())
        .limit(1)
    ).one()
