"""The hot-spare pool: its view, its policy, ``spare_pool.low`` once per crossing, a repaired
GPU joining it; and the latency summary and histograms of stored failovers."""

from __future__ import annotations

from typing import Any

from tests.failover.conftest import Fleet, iso


def _site(fleet: Fleet) -> None:
    """fra1 H100: node-1 with rented GPU-1, idle GPU-2 and spare S-1 (3 GPUs: 5 % -> 1)."""
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    fleet.gpu("node-1", "GPU-2")
    fleet.gpu("node-1", "S-1", "spare")


def _pool(fleet: Fleet) -> dict[str, Any]:
    [pool] = fleet.get("/v1/spare-pool")["pools"]
    return dict(pool)


def _counts(pool: dict[str, Any]) -> tuple[int, ...]:
    keys = ("total_gpus", "spare_gpus", "available", "reserved", "in_use", "target")
    return tuple(pool[k] for k in keys)


def test_pool_low_once_per_crossing_and_a_repaired_gpu_refills_it(fleet: Fleet) -> None:
    _site(fleet)
    fleet.rental("GPU-1")
    assert _counts(_pool(fleet)) == (3, 1, 1, 0, 0, 1)
    fleet.fail("GPU-1")
    reserved = _pool(fleet)
    assert _counts(reserved) == (3, 1, 0, 1, 0, 1) and reserved["below_target"]
    # The fleet page shows each count of the pool, "in use" beside available and reserved.
    page = fleet.console.client.get("/dashboard/fleet", headers=fleet.console.headers).text
    row = page[page.index('data-pool="H100/fra1"') :]
    for key in ("available", "reserved", "in_use", "preemptibly_rented", "failed"):
        assert f'data-api="{key}" data-raw="{reserved[key]}"' in row, key
    [low] = fleet.events("spare_pool.low")
    assert (low["data"]["available"], low["data"]["target"]) == (0, 1)
    assert low["subject"] == "spare_pool/fra1/H100"

    [failover] = fleet.failovers()
    fleet.console.post(f"/v1/failovers/{failover['id']}/resumed", {}, 200)
    assert _counts(_pool(fleet)) == (3, 0, 0, 0, 0, 1)
    assert len(fleet.events("spare_pool.low")) == 1  # still low: no second event

    # GPU-1 is repaired; its rental runs on S-1, so it is idle and refills the pool.
    fleet.report("GPU-1", [(fleet.t0 + 60, fleet.t0 + 90, "healthy")])
    assert fleet.get("/v1/gpus/GPU-1")["pool"] == "spare"
    refilled = _pool(fleet)
    assert _counts(refilled) == (3, 1, 1, 0, 0, 1) and not refilled["below_target"]

    # A new crossing is a new event: GPU-2's failover takes the repaired GPU-1.
    fleet.rental("GPU-2")
    fleet.fail("GPU-2")
    assert fleet.failovers(state="requested")[0]["spare_gpu_uuid"] == "GPU-1"
    assert len(fleet.events("spare_pool.low")) == 2


def test_policy_sets_the_target(fleet: Fleet) -> None:
    _site(fleet)
    policy = {"datacenter": "fra1", "model": "H100", "target_percent": "50", "min_count": 0}
    assert fleet.console.client.put(
        "/v1/spare-policies", json=policy, headers=fleet.console.headers
    ).json() == {**policy, "target_percent": "50.00"}
    assert _pool(fleet)["target"] == 2  # ceil(50 % of 3)
    [low] = fleet.events("spare_pool.low")  # 1 available < 2
    policy["min_count"] = 3
    fleet.console.client.put("/v1/spare-policies", json=policy, headers=fleet.console.headers)
    assert (_pool(fleet)["target"], _pool(fleet)["min_count"]) == (3, 3)
    assert fleet.events("spare_pool.low") == [low]  # was low already
    listed = fleet.get("/v1/spare-policies")["items"]
    assert [(p["datacenter"], p["model"], p["min_count"]) for p in listed] == [("fra1", "H100", 3)]


def test_summary_and_histograms_from_stored_failovers(fleet: Fleet) -> None:
    _site(fleet)
    fleet.rental("GPU-1")
    failed_at = fleet.fail("GPU-1")
    [failover] = fleet.failovers()
    path = f"/v1/failovers/{failover['id']}/resumed"
    fleet.console.post(path, {"resumed_at": iso(failed_at + 25)}, 200)
    [site] = fleet.get("/v1/failovers/summary")["sites"]
    assert (site["datacenter"], site["model"], site["failovers"]) == ("fra1", "H100", 1)
    assert site["resume"] == {"count": 1, "p50_s": 25.0, "p99_s": 25.0}
    # Detected when the agent's batch arrived: the test reported a failure of minutes ago.
    detected = site["detection"]
    assert detected["count"] == 1 and detected["p50_s"] == detected["p99_s"] > 60
    assert site["request"]["p50_s"] >= detected["p50_s"]
    metrics = fleet.client.get("/metrics", headers=fleet.console.headers).text
    for name in ("detection", "request", "resume"):
        assert (
            f'gpumeter_failover_{name}_seconds_count{{datacenter="fra1",model="H100",trigger="failed"}}'
            in (metrics)
        )
