"""Maintenance windows with explicit start and end, past ones included."""

from __future__ import annotations

from tests.harness import Console


def test_a_past_window_is_recorded_and_validated(console: Console) -> None:
    node = console.node()["node"]
    console.gpu(node["id"], "GPU-A")
    path = "/v1/gpus/GPU-A/maintenance"
    window = {"start_at": "2026-10-25T10:00:00Z", "end_at": "2026-10-25T11:00:00Z"}
    recorded = console.post(path, {**window, "reason": "PSU swap"}, 201)
    assert (recorded["start_at"], recorded["end_at"], recorded["reason"]) == (
        "2026-10-25T10:00:00Z",
        "2026-10-25T11:00:00Z",
        "PSU swap",
    )
    assert recorded["rentals"] == []  # nobody rented the GPU then
    overlap = {"start_at": "2026-10-25T10:59:59Z", "end_at": "2026-10-25T12:00:00Z"}
    clash = console.post(path, overlap, 409)
    assert clash["detail"][0]["loc"] == ["body", "start_at"]
    assert f"window {recorded['id']}" in clash["detail"][0]["msg"]
    touching = {"start_at": "2026-10-25T11:00:00Z", "end_at": "2026-10-25T12:00:00Z"}
    console.post(path, touching, 201)  # half-open: back to back is no overlap
    backwards = {"start_at": "2026-10-25T11:00:00Z", "end_at": "2026-10-25T11:00:00Z"}
    assert "after start_at" in console.post(path, backwards, 422)["detail"][0]["msg"]
    console.post("/v1/gpus/GPU-X/maintenance", window, 404)
