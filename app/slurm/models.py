"""A Slurm cluster in the loop: which account bills which customer, what each job became (its
rental), and the scheduler actions a failover or a repair asks of the adapter."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from sqlalchemy import CheckConstraint, ForeignKey, Index, String, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped, pg_enum

NAME_LENGTH = 64  # Slurm's account, cluster and node names are short identifiers


class SlurmAccount(Timestamped, Base):
    """A Slurm account's jobs are rentals of this customer on this plan."""

    __tablename__ = "slurm_accounts"

    account: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    plan_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("price_plans.id"))


class SlurmJob(Timestamped, Base):
    """A job the adapter saw holding GPUs, and what it became: its rental, or the reason it
    could not be attributed (kept, so a later snapshot attributes it once the cause is fixed).
    ``restarts`` and ``run_start_at`` are the run last attributed: a higher restart count in a
    snapshot is a requeue, whose ``submit_time`` is the second the previous run ended."""

    __tablename__ = "slurm_jobs"

    cluster: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    job_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    account: Mapped[str] = mapped_column(String(NAME_LENGTH))
    rental_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("rentals.id"), unique=True)
    state: Mapped[str] = mapped_column(String(32))  # Slurm's job state, as last seen
    restarts: Mapped[int] = mapped_column(default=0)
    run_start_at: Mapped[datetime | None]
    nodes: Mapped[list[str]] = mapped_column(JSONB, default=list)  # the attributed run's
    last_seen_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    problem: Mapped[str | None] = mapped_column(String(500))
    # Why Slurm cannot requeue the job (--no-requeue, interactive), as last seen; None: it can.
    requeue_refusal: Mapped[str | None] = mapped_column(String(200))


class ActionKind(StrEnum):
    FAILOVER = "failover"  # drain the failed node, requeue the job onto the spare node
    REPAIR = "repair"  # the failed GPU is healthy again: resume its node


class SlurmAction(Timestamped, Base):
    """What the adapter is asked to do in Slurm, until it reports it done (at least once:
    each step is idempotent, so an adapter restarted mid-way repeats nothing)."""

    __tablename__ = "slurm_actions"
    __table_args__ = (
        CheckConstraint(
            "kind <> 'failover' OR (failover_id IS NOT NULL AND job_id IS NOT NULL)",
            name="failover_has_job",
        ),
        # One failover action per failover, one open repair per node.
        Index("uq_slurm_actions_failover", "failover_id", unique=True),
        Index(
            "uq_slurm_actions_open_repair",
            "cluster",
            "node",
            unique=True,
            postgresql_where=text("kind = 'repair' AND done_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    kind: Mapped[ActionKind] = mapped_column(pg_enum(ActionKind, "slurm_action_kind"))
    cluster: Mapped[str] = mapped_column(String(NAME_LENGTH))
    node: Mapped[str] = mapped_column(String(NAME_LENGTH))  # drained (failover), resumed (repair)
    failover_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("failovers.id"))
    job_id: Mapped[int | None]
    spare_node: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    nodes_after: Mapped[list[str]] = mapped_column(JSONB, default=list)  # the job's next run
    restarts_before: Mapped[int | None]  # the job's restart count when the GPU failed
    reason: Mapped[str] = mapped_column(String(500))
    done_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(String(500))
