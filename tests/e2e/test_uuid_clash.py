"""A GPU UUID clash with real processes: a rogue (mis-imaged) node claims one of a genuine
node's GPU UUIDs first. Only that GPU's reports are held; the genuine node's other GPUs keep
being metered to the second; an operator settles the clash with the CLI, the genuine node's
held records are then stored and the rogue's refused, and the rogue agent keeps what the
service refuses in its dead-letter folder, with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest

from app.core.processes import wait_until
from metering_agent.nvml.simulated import sim_uuid
from tests.e2e.conftest import BIN, Fleet, assert_exact_cover

pytestmark = pytest.mark.e2e
GENUINE = "node-good"


def node_id(fleet: Fleet, hostname: str) -> str:
    [node] = [n for n in fleet.get("/v1/nodes")["items"] if n["hostname"] == hostname]
    return node["id"]


def registered(fleet: Fleet, gpu: str) -> dict[str, object] | None:
    return next((g for g in fleet.gpus() if g["uuid"] == gpu), None)


def stored_until(fleet: Fleet, gpu: str, since: int) -> int:
    """The end of the GPU's newest stored second (``since`` if none)."""
    segments = fleet.timeline(gpu, since, int(time.time()) + 1)["segments"]
    return max((s["end_s"] for s in segments), default=since)


def gpumeter(fleet: Fleet, *args: str) -> dict[str, Any]:
    env = {**os.environ, "GPUMETER_DATABASE_URL": fleet.service.database_url}
    ran = subprocess.run(
        [str(BIN / "gpumeter"), *args, "--json"], env=env, capture_output=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr.decode()
    return json.loads(ran.stdout)


def test_a_rogue_node_claiming_a_gpu_holds_only_that_gpu_until_the_clash_is_settled(
    fleet: Fleet,
) -> None:
    gpus = [sim_uuid(GENUINE, i, GENUINE) for i in range(3)]
    disputed, others = gpus[0], gpus[1:]
    rogue_token, genuine_token = fleet.node("node-rogue"), fleet.node(GENUINE)
    # The rogue was imaged from the genuine node: its one GPU has the genuine node's GPU 0 UUID.
    fleet.agent(
        "node-rogue", rogue_token, "--simulate", "1", "--node-name", GENUINE,
        "--uuid-prefix", GENUINE,
    )  # fmt: skip
    assert wait_until(lambda: registered(fleet, disputed) is not None, 60)
    rogue_id, genuine_id = node_id(fleet, "node-rogue"), node_id(fleet, GENUINE)
    assert registered(fleet, disputed)["node_id"] == rogue_id  # type: ignore[index]
    t0 = int(time.time())
    fleet.agent(GENUINE, genuine_token, "--simulate", "3")
    # The genuine node's other GPUs are metered to the second, the clash notwithstanding.
    assert wait_until(
        lambda: (
            all(registered(fleet, g) for g in others)
            and min(stored_until(fleet, g, t0) for g in others) >= t0 + 10
        ),
        60,
    ), fleet.gpus()
    first = min(fleet.timeline(g, t0, t0 + 60)["segments"][0]["start_s"] for g in others)
    checked = int(time.time()) - 2
    for gpu in others:
        timeline = fleet.timeline(gpu, first, checked)
        assert_exact_cover(timeline, first, checked)
        assert timeline["unmetered"] == [], timeline
    # GPU 0 is in dispute: both nodes' reports of it are held, not stored.
    assert registered(fleet, disputed)["disputed_at"]  # type: ignore[index]
    clash = gpumeter(fleet, "gpus", "claims", disputed)
    held = {h["node_id"]: h["records"] for h in clash["held"]}
    assert set(held) == {rogue_id, genuine_id} and all(held.values()), clash
    [event] = fleet.get("/v1/events?type=gpu.uuid_clash")["items"]
    assert (event["data"]["registered_node_id"], event["data"]["claiming_node_id"]) == (
        rogue_id,
        genuine_id,
    )
    dispute_began = stored_until(fleet, disputed, t0 - 60)
    # The operator settles: GPU 0 is the genuine node's.
    settled = gpumeter(fleet, "gpus", "settle", disputed, "--node", genuine_id)
    assert settled["stored_records"] > 0, settled
    [refused] = settled["refused"]
    assert refused["node_id"] == rogue_id and refused["records"] > 0
    assert f"settled to node {genuine_id} ({GENUINE})" in refused["reason"]
    # Its held seconds are stored, and its later ones keep coming: metered from the genuine
    # node's first second on, without a gap.
    settled_at = int(time.time())
    assert wait_until(lambda: stored_until(fleet, disputed, first) >= settled_at + 4, 30)
    timeline = fleet.timeline(disputed, first, settled_at)
    assert_exact_cover(timeline, first, settled_at)
    assert timeline["unmetered"] == [] and dispute_began < settled_at
    # The rogue's reports are refused from now on; its agent keeps them with the reason.
    dead = fleet.tmp / "spool-node-rogue" / "dead-letter"
    assert wait_until(lambda: any(dead.glob("*.refused.json")), 30)
    kept = json.loads(next(dead.glob("*.refused.json")).read_text())
    item = kept["items"][0]
    assert (item["gpu_uuid"], item["outcome"]) == (disputed, "refused")
    assert item["item"]["gpu_uuid"] == disputed and "settled to node" in item["reason"]
    # The genuine node lost nothing and kept nothing aside.
    assert not list((fleet.tmp / f"spool-{GENUINE}" / "dead-letter").iterdir())
