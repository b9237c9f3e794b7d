"""A plan's preemptible price: stored with its effective-dated row, and needed to rent
preemptibly."""

from __future__ import annotations

from tests.harness import Console

PRICE = {"gpu_model": "H100", "price_per_hour": "2.49", "effective_from": "2026-01-01T00:00:00Z"}


def test_preemptible_price_is_read_back_with_its_row(console: Console) -> None:
    plan = console.post(
        "/v1/plans", {"name": "spot", "prices": [{**PRICE, "preemptible_price_per_hour": "0.99"}]}
    )
    [price] = plan["prices"]
    assert (price["price_per_hour"], price["preemptible_price_per_hour"]) == (
        "2.4900000000",
        "0.9900000000",
    )


def test_negative_preemptible_price_is_refused(console: Console) -> None:
    body = {"name": "bad", "prices": [{**PRICE, "preemptible_price_per_hour": "-1"}]}
    refused = console.post("/v1/plans", body, 422)
    assert refused["detail"][0]["loc"][-1] == "preemptible_price_per_hour"


def test_renting_preemptibly_needs_a_preemptible_price(console: Console) -> None:
    customer = console.customer()["id"]
    plan = console.plan()["id"]  # no preemptible price
    refused = console.post(
        "/v1/rentals", console.rental_body(customer, plan, preemptible=True), 422
    )
    assert refused["detail"][0] == {
        "loc": ["body", "gpu_model"],
        "msg": "plan 'on-demand' has no preemptible price for GPU model 'H100'",
        "type": "unprocessable",
    }
    regular = console.rental(customer, plan)
    assert (regular["preemptible"], regular["preempted_at"]) == (False, None)
