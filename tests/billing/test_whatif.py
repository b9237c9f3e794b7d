from decimal import Decimal
from pathlib import Path

from app.billing.core.domain import Assignment, Migration, RatingInputs
from app.billing.core.whatif import what_if

from .factories import DAY, MONTH, failed, healthy, rental, usd_plan

F = 10 * DAY
END = MONTH[1]


def _table(failure_s: int, window_s: int):
    resumed = F + failure_s + window_s
    assignments = [Assignment("r1", "A", 0, F + failure_s), Assignment("r1", "B", resumed, END)]
    segments = {
        "A": [healthy("A", 0, F), failed("A", F, F + failure_s)],
        "B": [healthy("B", 0, END)],
    }
    migration = Migration("r1", "A", "B", F + failure_s, resumed)
    return what_if(
        RatingInputs([rental(usd_plan())], assignments, segments, {}, [migration], MONTH)
    )


def test_47_minute_failure_exceeds_manual_recovery_so_no_top_up() -> None:
    table = _table(2820, 30)
    by_increment = {row.increment_s: row for row in table.rows}
    assert sorted(by_increment) == [1, 60, 3600]
    one_s = by_increment[1]
    assert (one_s.with_credits.amount, one_s.with_credits.billed_s) == (
        Decimal("1790.83"),
        30 * DAY - 2850,
    )
    assert (one_s.without_credits.amount, one_s.without_credits.billed_s) == (
        Decimal("1792.80"),
        30 * DAY,
    )
    assert one_s.difference == Decimal("1.97")


def test_coarser_increments_round_each_session_up() -> None:
    rows = {row.increment_s: row for row in _table(2820, 30).rows}
    # Sessions round billed and credited seconds together: A bills 864,000 s and fails 2,820 s
    # (866,820 s: whole minutes, 780 s short of an hour); B bills 1,725,150 s.
    assert rows[60].with_credits.billed_s == 864000 + 1725180
    assert rows[3600].with_credits.billed_s == 864000 + 780 + 1728000
    assert rows[3600].with_credits.amount == Decimal("1793.34")  # 2,592,780 s x 2.49 / 3600
    assert rows[3600].without_credits.amount == Decimal("1795.31")  # + the 2,850 s: 1.97


def test_short_incident_is_billed_at_least_the_manual_recovery_time() -> None:
    row = _table(600, 30).rows[0]
    # Downtime 630 s; without credits it costs 2820 s: a 2190-s top-up at 2.49/h = 1.51475.
    assert row.without_credits.billed_s == 30 * DAY + 2190
    assert row.without_credits.amount == Decimal("1792.80") + Decimal("1.51")
    # 600 s x 2.49 / 3600 = 0.415 -> 0.42 (half-up); the 30-s window 0.02075 -> 0.02.
    assert row.with_credits.amount == Decimal("1792.80") - Decimal("0.42") - Decimal("0.02")


def _fully_credited_session() -> RatingInputs:
    """docs/billing.md's worked example: 3.60/h (0.001 $/s), 60-s increment, 1-h minimum per
    session. GPU A fails for its whole 10-minute session; the rental goes on on GPU B for 2 h."""
    plan = usd_plan("3.60", increment_s=60, minimum_s=3600)
    assignments = [Assignment("r1", "A", 0, 600), Assignment("r1", "B", 600, 7800)]
    segments = {"A": [failed("A", 0, 600)], "B": [healthy("B", 600, 7800)]}
    return RatingInputs([rental(plan)], assignments, segments, {}, [], MONTH)


def test_a_session_none_of_whose_seconds_was_billed_bills_no_minimum() -> None:
    """With credits, A bills nothing (no minimum): 7.20 for B's 2 h. Without automatic credits
    A's 600 s are billed and raised to its 1-h minimum: 3.60 + 7.20 = 10.80. The columns then
    differ by 3.60, more than the 0.60 of downtime (elsewhere they differ by the downtime)."""
    for manual_recovery_s in (0, 2820):  # A's top-up to 2,820 s counts towards the minimum
        table = what_if(_fully_credited_session(), manual_recovery_s=manual_recovery_s)
        for row in table.rows:
            assert (row.with_credits.amount, row.with_credits.billed_s) == (
                Decimal("7.20"),
                7200,
            )
            assert (row.without_credits.amount, row.without_credits.billed_s) == (
                Decimal("10.80"),
                10800,
            )
            assert row.difference == Decimal("3.60") > Decimal("0.60")


def test_the_billing_page_states_the_no_minimum_rule_with_its_worked_example() -> None:
    billing = (Path(__file__).parents[2] / "docs" / "billing.md").read_text()
    rules = billing[billing.index("## Billing rules") : billing.index("## Invoice runs")]
    assert "**A session none of whose seconds was billed bills nothing: no minimum**" in rules
    [row] = {
        (r.with_credits.amount, r.without_credits.amount, r.difference)
        for r in what_if(_fully_credited_session()).rows
    }
    assert "with credits **{}**, without **{}**: they differ by **{}**".format(*row) in rules
