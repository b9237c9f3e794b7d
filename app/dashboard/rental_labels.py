"""What the pages call a rental: ``app.rentals.service.display_name`` in the viewer's zone."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from sqlalchemy.orm import Session

from app.dashboard.formatting import Formatter
from app.rentals import reads as rentals_reads
from app.rentals.models import Rental
from app.rentals.service import display_name, display_names


def label(rental: Rental, fmt: Formatter) -> str:
    return display_name(rental, fmt.timezone)


def labels(
    session: Session, customer_id: uuid.UUID, rental_ids: Collection[uuid.UUID], fmt: Formatter
) -> dict[uuid.UUID, str]:
    """Each of the customer's ``rental_ids`` with its label (one query)."""
    return display_names(session, customer_id, rental_ids, fmt.timezone)


def labels_overlapping(
    session: Session, customer_id: uuid.UUID, start: datetime, end: datetime, fmt: Formatter
) -> dict[uuid.UUID, str]:
    """Each of the customer's rentals overlapping [start, end) with its label (one query)."""
    rentals = rentals_reads.rentals_overlapping(session, [customer_id], start, end)
    return {rental.id: label(rental, fmt) for rental in rentals}
