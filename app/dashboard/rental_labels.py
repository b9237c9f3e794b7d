"""What the pages call a rental: the name its customer gave it, else what it rents and when."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from sqlalchemy.orm import Session

from app.core.epoch import epoch
from app.dashboard.formatting import Formatter
from app.rentals import repository as rentals_repository
from app.rentals.models import Rental


def label(rental: Rental, fmt: Formatter) -> str:
    end = None if rental.end_at is None else epoch(rental.end_at)
    return fmt.rental(rental.gpu_count, rental.gpu_model, epoch(rental.start_at), end, rental.name)


def labels(
    session: Session, customer_id: uuid.UUID, rental_ids: Collection[uuid.UUID], fmt: Formatter
) -> dict[uuid.UUID, str]:
    """Each of the customer's ``rental_ids`` with its label (one query)."""
    if not rental_ids:
        return {}
    rentals = rentals_repository.rentals_of(session, customer_id, rental_ids)
    return {rental.id: label(rental, fmt) for rental in rentals}


def labels_overlapping(
    session: Session, customer_id: uuid.UUID, start: datetime, end: datetime, fmt: Formatter
) -> dict[uuid.UUID, str]:
    """Each of the customer's rentals overlapping [start, end) with its label (one query)."""
    rentals = rentals_repository.rentals_overlapping(session, [customer_id], start, end)
    return {rental.id: label(rental, fmt) for rental in rentals}
