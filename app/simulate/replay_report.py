"""The replayed scenario's table and the arithmetic behind it, for a reader to check.

Everything printed to stdout is deterministic for a seed and scale (timings go to stderr), and
the last line is the same figures as JSON: amounts as decimal strings, durations in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any

from app.billing.core.domain import Bucket
from app.core.epoch import from_epoch
from app.core.money import time_amount
from app.simulate.replay import Replay
from app.simulate.scenarios import HOUR, RootCause, expected

INCREMENT_NAMES = {3600: "1 h", 60: "1 min", 1: "1 s"}


def hours(seconds: int | Fraction) -> str:
    """GPU-hours to 0.01, from exact seconds (or a Fraction of hours times 3600)."""
    exact = Fraction(seconds) / HOUR
    value = (Decimal(exact.numerator) / exact.denominator).quantize(Decimal("0.01"), ROUND_HALF_UP)
    return f"{value:,}"


def exact_hours(value: Fraction) -> str:
    return hours(value * HOUR)


def money(amount: Decimal) -> str:
    return f"{amount:,.2f}"


def _day(at: int) -> str:
    return datetime.strftime(from_epoch(at), "%Y-%m-%d %H:%M")


def render(replay: Replay, scale: float, seed: int) -> list[str]:
    return [
        *_heading(replay, scale, seed),
        "",
        *_cost_table(replay),
        "",
        *_usage_table(replay),
        "",
        *_arithmetic(replay),
        *_root_causes(replay.scenario.root_causes),
    ]


def _heading(r: Replay, scale: float, seed: int) -> list[str]:
    s = r.scenario
    auto_low, auto_high = s.auto_window_s
    return [
        f"scenario {s.name} (scale {scale:g}, seed {seed}): {s.title}",
        f"  {r.gpus:,} x {s.model} rented {_day(r.span[0])} -> {_day(r.span[1])} UTC "
        f"at {s.price_per_hour} USD/GPU-h; {r.spares:,} hot spares",
        f"  failures {float(s.failures_per_gpu_day):.4%} per GPU-day; manual recovery "
        f"{s.manual_recovery_s // 60} min; automatic failover {auto_low}-{auto_high} s; "
        f"idle {float(s.idle_share):.1%} of rented GPU-hours",
        *(f"  source: {line}" for line in s.sources),
    ]


def _cost_table(r: Replay) -> list[str]:
    lines = [
        f"Total cost ({r.table.currency}, before vouchers and tax), rated from the stored data",
        f"{'increment':<10}{'automatic (credited)':>38}{'manual (not credited)':>38}"
        f"{'manual - automatic':>20}",
        f"{'':<10}{'billed GPU-h':>19}{'cost':>19}{'billed GPU-h':>19}{'cost':>19}",
    ]
    for row in r.table.rows:
        auto, manual = row.with_credits, row.without_credits
        lines.append(
            f"{INCREMENT_NAMES[row.increment_s]:<10}"
            f"{hours(auto.billed_s):>19}{money(auto.amount):>19}"
            f"{hours(manual.billed_s):>19}{money(manual.amount):>19}"
            f"{money(row.difference):>20}"
        )
    return lines


def _usage_table(r: Replay) -> list[str]:
    u = r.usage
    rows = [
        ("rented GPU-hours", hours(u.rented_s), hours(u.rented_s)),
        ("downtime GPU-hours", hours(u.credited_s), hours(r.manual_downtime_s)),
        ("credited GPU-hours", hours(u.credited_s), "0.00"),
        ("idle GPU-hours (measured)", hours(u.idle_s), hours(u.idle_s)),
        ("effective GPU-hours", hours(u.effective_s), hours(r.manual_effective_s)),
    ]
    return [
        f"{'':<28}{'automatic':>19}{'manual':>19}",
        *(f"{name:<28}{auto:>19}{manual:>19}" for name, auto, manual in rows),
    ]


def _arithmetic(r: Replay) -> list[str]:
    s, u = r.scenario, r.usage
    e = expected(s, r.gpus)
    rate = s.failures_per_gpu_day
    by_increment = {row.increment_s: row for row in r.table.rows}
    second = by_increment[1].with_credits
    check = time_amount(second.billed_s, r.price, r.table.currency)
    mean_s = Fraction(sum(s.auto_window_s), 2)
    return [
        "Arithmetic (inputs -> mean expected | stored data -> rated or measured)",
        f"  rented: {r.gpus:,} GPUs x {s.days} d x 24 h = {exact_hours(e.rented_gpu_h)} GPU-h"
        f" | rated {hours(u.rented_s)} GPU-h ({u.rented_s:,} s)",
        f"  failures: {r.gpus:,} x {s.days} d x {float(rate):.6%} = {float(e.failures):,.2f}"
        f" | stored {r.report.failures:,} on all {r.gpus + r.spares:,} GPUs (spares fail too),"
        f" {r.report.migrations:,} failovers of the rental to a spare",
        f"  manual downtime: {float(e.failures):,.2f} x {s.manual_recovery_s // 60} min"
        f" = {exact_hours(e.manual_downtime_gpu_h)} GPU-h"
        f" | {r.incidents:,} incidents x max(incident, {s.manual_recovery_s // 60} min)"
        f" = {hours(r.manual_downtime_s)} GPU-h",
        f"  automatic downtime: {float(e.failures):,.2f} x {float(mean_s):g} s"
        f" = {exact_hours(e.auto_downtime_gpu_h)} GPU-h"
        f" | credited {hours(u.credited_s)} GPU-h ({u.credited_s:,} s: "
        f"{_bucket_words(r)})",
        f"  idle: {float(s.idle_share):.1%} x {exact_hours(e.rented_gpu_h)}"
        f" = {exact_hours(e.idle_gpu_h)} GPU-h"
        f" | measured {hours(u.idle_s)} GPU-h ({u.idle_s / max(u.rented_s, 1):.2%} of rented;"
        f" only billed seconds count)",
        f"  every rented second at the price: {exact_hours(e.rented_gpu_h)} x "
        f"{s.price_per_hour} = {money(e.cost_all_rented)}",
        f"  1 s, automatic: {second.billed_s:,} billed s x {s.price_per_hour} / 3600"
        f" = {money(check)} ({'equals' if check == second.amount else 'DIFFERS from'}"
        f" the rated {money(second.amount)})",
        "  1 s, manual: every rented second is billed, plus each incident's top-up to"
        f" {s.manual_recovery_s // 60} min (the what-if's rule), on top of the spare's seconds",
        "  1 min / 1 h: each failover ends one session and starts another, each rounded up:"
        f" ~ {r.report.migrations:,} x (1/2 + 1/2) increments more than 1 s",
        f"  effective, automatic: rented - credited - unmeasured - idle = {hours(u.rented_s)}"
        f" - {hours(u.credited_s)} - {hours(u.unmeasured_s)} - {hours(u.idle_s)}"
        f" = {hours(u.effective_s)}",
        f"  effective, manual: rented - manual downtime - unmeasured - idle = "
        f"{hours(u.rented_s)} - {hours(r.manual_downtime_s)} - {hours(u.unmeasured_s)}"
        f" - {hours(u.idle_s)} = {hours(r.manual_effective_s)}",
    ]


def _bucket_words(r: Replay) -> str:
    names: dict[Bucket, str] = {
        Bucket.MIGRATION_CREDIT: "migration windows",
        Bucket.FAILURE_CREDIT: "failed on the rental's GPU",
    }
    return ", ".join(f"{r.buckets[b]:,} s {name}" for b, name in names.items())


def _root_causes(causes: tuple[RootCause, ...]) -> list[str]:
    if not causes:
        return []
    total = sum(c.count for c in causes)
    published = sum(Decimal(c.published_percent) for c in causes)
    lines = [
        "",
        "Root causes of the unexpected interruptions, as published, with each count's share",
        f"{'component':<32}{'category':<24}{'count':>6}{'published %':>13}{'count / total %':>17}",
    ]
    for c in causes:
        share = _percent(c.count, total)
        flag = "" if share == Decimal(c.published_percent) else "  <- does not follow"
        lines.append(
            f"{c.component:<32}{c.category:<24}{c.count:>6}{c.published_percent:>13}"
            f"{share:>17}{flag}"
        )
    gpu = [c for c in causes if c.category == "GPU"]
    gpu_count = sum(c.count for c in gpu)
    gpu_published = sum(Decimal(c.published_percent) for c in gpu)
    lines += [
        f"  counts sum to {total}; published percentages sum to {published} %",
        f"  GPU categories: {gpu_count} of {total} = {_percent(gpu_count, total)} %; the "
        f"published GPU share {gpu_published} % is the sum of the published percentages",
    ]
    return lines


def _percent(count: int, total: int) -> Decimal:
    return (Decimal(100 * count) / total).quantize(Decimal("0.1"), ROUND_HALF_UP)


def figures(replay: Replay, scale: float, seed: int) -> dict[str, Any]:
    u = replay.usage

    def cell(c: Any) -> dict[str, Any]:
        return {"amount": str(c.amount), "billed_s": c.billed_s}

    rows = [
        {
            "increment_s": row.increment_s,
            "automatic": cell(row.with_credits),
            "manual": cell(row.without_credits),
        }
        for row in replay.table.rows
    ]
    return {
        "scenario": replay.scenario.name,
        "scale": scale,
        "seed": seed,
        "gpus": replay.gpus,
        "spares": replay.spares,
        "currency": replay.table.currency,
        "rows": rows,
        "rented_s": u.rented_s,
        "credited_s": u.credited_s,
        "idle_s": u.idle_s,
        "unmeasured_s": u.unmeasured_s,
        "manual_downtime_s": replay.manual_downtime_s,
        "effective_s": {"automatic": u.effective_s, "manual": replay.manual_effective_s},
        "failures": replay.report.failures,
        "migrations": replay.report.migrations,
        "incidents": replay.incidents,
        "buckets_s": {b.value: s for b, s in replay.buckets.items()},
    }


def print_replay(replay: Replay, scale: float, seed: int, out: Callable[[str], None]) -> None:
    for line in render(replay, scale, seed):
        out(line)
    out(json.dumps(figures(replay, scale, seed)))
