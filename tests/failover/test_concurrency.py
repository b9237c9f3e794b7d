"""No spare is promised twice: failovers opened in concurrent transactions (as concurrent
ingests open them) and a new rental racing them each get a different spare or none."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime

from sqlalchemy import Engine

from app.core.db import transaction
from app.core.epoch import from_epoch
from app.core.errors import Conflict
from app.failover import service
from app.rentals import service as rentals
from app.rentals.schemas import AssignmentCreate
from app.settings import get_settings
from tests.failover.conftest import Fleet

FAILURES = 8
SPARES = 3


def test_concurrent_failovers_never_share_a_spare(fleet: Fleet, db: Engine) -> None:
    for n in range(FAILURES):
        fleet.node(f"node-{n}")
        fleet.gpu(f"node-{n}", f"GPU-{n}")
    fleet.node("spares")
    spares = {fleet.gpu("spares", f"S-{n}", "spare") for n in range(SPARES)}
    for n in range(FAILURES):
        fleet.rental(f"GPU-{n}")
    racer = fleet.console.rental(fleet.customer_id, fleet.plan_id)  # wants a spare too
    failed_at = from_epoch(fleet.t0 + 30)
    start = threading.Barrier(FAILURES + 1)
    outcomes: Counter[str] = Counter()
    errors: list[BaseException] = []

    def open_failover(gpu: str) -> None:
        try:
            with transaction(db) as session:
                start.wait(timeout=30)
                now, config = datetime.now(UTC), service.FailoverSettings.of(get_settings())
                opened = service.open_failover(session, gpu, failed_at, now, [], config)
                assert opened is not None
                outcomes[opened.state.value] += 1
        except BaseException as error:  # reported below: a thread's failure fails the test
            errors.append(error)

    def rent_a_spare() -> None:
        body = AssignmentCreate(gpu_uuid="S-0", start_at=from_epoch(fleet.t0 + 120))
        try:
            with transaction(db) as session:
                start.wait(timeout=30)
                rentals.assign_gpu(session, rentals.rental_by_id(session, racer["id"]), body)
                outcomes["rented"] += 1
        except Conflict:
            outcomes["refused"] += 1

    threads = [threading.Thread(target=open_failover, args=(f"GPU-{n}",)) for n in range(FAILURES)]
    threads.append(threading.Thread(target=rent_a_spare))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    failovers = fleet.failovers()
    reserved = [f["spare_gpu_uuid"] for f in failovers if f["state"] == "requested"]
    assert len(reserved) == len(set(reserved))  # never one spare twice
    assert set(reserved) <= spares
    rented = fleet.get(f"/v1/rentals/{racer['id']}")["assignments"]
    # S-0 went to the racing rental or to a failover, never to both; every other spare was
    # reserved, and the failovers left over found none.
    taken = set(reserved) | {a["gpu_uuid"] for a in rented}
    assert taken == spares and len(reserved) + len(rented) == SPARES
    assert outcomes["requested"] == len(reserved)
    assert outcomes["no_spare"] == FAILURES - len(reserved)
    assert outcomes["rented"] + outcomes["refused"] == 1
