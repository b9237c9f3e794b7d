"""A Slurm job's GPU degraded past its plan's time (issue 42) is failed over through the same
adapter actions as a failed one: the node drained with the degraded cause as its reason and
the job requeued onto the spare's node; the resume records the migration from the decision."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine

from app.core.db import transaction
from app.core.epoch import epoch, from_epoch
from app.failover.degraded import check_degraded
from app.failover.service import FailoverSettings
from app.settings import get_settings
from tests.slurm.conftest import CLUSTER, SlurmWorld, gpu_of, job

TWO_NODES = {"n1": [0, 1], "n2": [0, 1]}


def test_a_degraded_gpu_of_a_slurm_job_is_failed_over_through_actions(
    world: SlurmWorld, db: Engine
) -> None:
    t0 = world.t0
    policy = {"migrate_degraded_after_s": 20, "migrate_degraded_causes": ["nvlink_down"]}
    response = world.client.patch(
        f"/v1/plans/{world.plan_id}", json=policy, headers=world.console.headers
    )
    assert response.status_code == 200, response.text
    world.snapshot(job(7, "RUNNING", start=t0, nodes=TWO_NODES), at=t0 + 1)
    gpu = gpu_of("n1", 0)
    cause = {"rule": "nvlink_down", "state": "degraded", "nvlink_links_down": 1}
    change = {"event_id": f"deg-{t0}", "gpu_uuid": gpu, "at": t0 + 10, "kind": "state_change",
              "state": "degraded", "rule": "nvlink_down",
              "detail": {"from": "healthy", "evidence": [cause]}}  # fmt: skip
    records = [
        {"gpu_uuid": gpu, "model": "H100", "start": a, "end": b, "state": s,
         "sample_count": b - a, "device_index": 0}
        for a, b, s in ((t0, t0 + 10, "healthy"), (t0 + 10, t0 + 35, "degraded"))
    ]  # fmt: skip
    world.agents["n1"].post(records, [change])
    with transaction(db) as session:
        config = FailoverSettings.of(get_settings())
        [opened] = check_degraded(session, from_epoch(t0 + 35), config)
        failover_id = opened.id
    [action] = world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"]
    assert (action["kind"], action["node"], action["spare_node"], action["job_id"]) == (
        "failover", "n1", "n3", 7,
    )  # fmt: skip
    assert action["reason"] == (
        f"gpumeter: GPU 0 ({gpu}) degraded nvlink_down; failover {failover_id}"
    )
    body = {"resumed_at": from_epoch(t0 + 50).isoformat()}
    world.console.post(f"/v1/failovers/{failover_id}/resumed", body, 200)
    [migration] = world.get(f"/v1/rentals/{world.job_row(7)['rental_id']}")["migrations"]
    window = [epoch(datetime.fromisoformat(migration[k])) for k in ("failed_at", "resumed_at")]
    assert window == [t0 + 35, t0 + 50]  # from the decision, not the first degraded second
