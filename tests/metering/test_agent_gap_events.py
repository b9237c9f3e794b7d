"""The agent's ``unmetered`` events (issue 12) are accepted and explain the timeline's gap."""

from __future__ import annotations

from dataclasses import asdict

from fastapi.testclient import TestClient

from metering_agent.records import unmetered_event
from tests.harness import Console
from tests.metering.conftest import Agent, minute_ago, rec


def test_an_unmetered_event_sits_on_the_gap_it_explains(
    agent: Agent, client: TestClient, console: Console
) -> None:
    t = minute_ago(5)
    frozen = asdict(unmetered_event("GPU-1", t + 20, t + 24, "agent_paused"))
    agent.post([rec("GPU-1", t, t + 20), rec("GPU-1", t + 24, t + 60)], [frozen])
    timeline = client.get(
        f"/v1/gpus/GPU-1/timeline?start={t}&end={t + 60}", headers=console.headers
    ).json()
    assert [(g["start_s"], g["end_s"]) for g in timeline["unmetered"]] == [(t + 20, t + 24)]
    [reported] = timeline["events"]
    assert (reported["kind"], reported["at_s"], reported["rule"]) == (
        "unmetered",
        t + 20,
        "agent_paused",
    )
    assert reported["detail"] == {
        "start": t + 20, "end": t + 24, "seconds": 4, "reason": "agent_paused"
    }  # fmt: skip
