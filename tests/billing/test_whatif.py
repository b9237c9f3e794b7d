from decimal import Decimal

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
