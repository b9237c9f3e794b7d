"""Voucher ledger: append-only entries per customer, and the pure rules that write them.

API:
    VoucherEntry, EntryKind, OpenVoucher
    issue_voucher(voucher_id, customer_id, amount, issued_at, validity_days, source, reason)
    issue_tier_vouchers(rated_rentals, period, issued_at) -> list[VoucherEntry]
    open_vouchers(entries) -> list[OpenVoucher]
    apply_vouchers(open_vouchers, amount_due, as_of, invoice_id) -> (applications, expirations)
    balance(entries) -> Decimal
    usable(open_vouchers, as_of) -> Decimal
    take_back(earned, entries, at, invoice_id, reason) -> list[VoucherEntry]
    earned_again(tier, voided, entries, void_invoice_ids, invoice_id) -> list[VoucherEntry]

Rules:
* Amounts in entries are always positive; a voucher's remaining balance is
  issued - applied - expired and never negative. A customer's vouchers share one currency.
* A voucher is usable while ``as_of < expires_at``: it applies to any invoice finalized
  while it is valid, whatever period that invoice covers (``as_of`` = the finalization, or
  for a draft the time it was drafted, which shows what would apply then).
* Tier vouchers: the rental's continuous duration at period end is
  min(rental_end, period_end) - rental_start, in whole days; the highest tier whose
  ``min_days`` it meets gives ``percent`` % of the rental's net (charges + credits + cap),
  rounded half-up once; nothing is issued for a net <= 0. Voucher id: ``tier:<rental>:<period
  start>`` so re-running finalization issues the same id (idempotent upsert downstream).
* Application: vouchers expired by ``as_of`` with a remaining balance get an expiry entry
  dated at their expiry (never later than ``as_of``, so never in the future); the rest apply
  oldest expiry first (then by id), each taking min(remaining, amount still due), never
  taking the amount due below zero.
* Void and replacement: voiding an invoice takes back what is left of the vouchers it earned
  (and of their reissues: a consumed voucher that a void returned, ``reissue:<invoice>:<id>``)
  as ``revoked`` entries; what was spent of them stays spent. The replacement invoice of the
  same period earns its tier vouchers again at its finalization, less what was spent of the
  voided invoice's (applied to invoices that are not void), under the id
  ``tier:<rental>:<period start>:<invoice>``: the customer never holds a period's tier voucher
  twice, nor loses what the replacement earns. When the replacement earns less than was spent
  already, it issues nothing and the customer keeps the difference (a voucher is never
  negative; billing operations may correct it on a later invoice).
"""

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from app.billing.core.intervals import Span
from app.billing.core.rating import RatedRental
from app.core.money import round_money

SECONDS_PER_DAY = 86400


class EntryKind(StrEnum):
    ISSUED = "issued"
    APPLIED = "applied"
    EXPIRED = "expired"
    REVOKED = "revoked"  # taken back by voiding the invoice that earned it


@dataclass(frozen=True)
class VoucherEntry:
    kind: EntryKind
    voucher_id: str
    customer_id: str
    amount: Decimal  # positive
    at: int
    expires_at: int | None = None  # issued entries only
    source: str | None = None  # issued entries only: "tier" or "manual"
    reason: str = ""
    invoice_id: str | None = None  # applied entries only

    def __post_init__(self) -> None:
        if self.amount <= 0:
            raise ValueError("ledger amounts are positive")
        if (self.kind is EntryKind.ISSUED) != (self.expires_at is not None):
            raise ValueError("exactly the issued entries carry an expiry")


@dataclass(frozen=True)
class OpenVoucher:
    voucher_id: str
    customer_id: str
    expires_at: int
    remaining: Decimal


def issue_voucher(
    voucher_id: str,
    customer_id: str,
    amount: Decimal,
    issued_at: int,
    validity_days: int,
    source: str,
    reason: str,
) -> VoucherEntry:
    expires_at = issued_at + validity_days * SECONDS_PER_DAY
    return VoucherEntry(
        EntryKind.ISSUED, voucher_id, customer_id, amount, issued_at, expires_at, source, reason
    )


def issue_tier_vouchers(
    rated_rentals: Iterable[RatedRental], period: Span, issued_at: int
) -> list[VoucherEntry]:
    entries = []
    for rated in rated_rentals:
        rental, plan = rated.rental, rated.rental.plan
        days = (rental.end_by(period[1]) - rental.rental_start) // SECONDS_PER_DAY
        tiers = [t for t in plan.voucher_tiers if t.min_days <= days]
        if not tiers:
            continue
        tier = max(tiers, key=lambda t: t.min_days)
        amount = round_money(rated.net * tier.percent / 100, plan.currency)
        if amount <= 0:
            continue
        entries.append(
            issue_voucher(
                f"tier:{rental.rental_id}:{period[0]}",
                rental.customer_id,
                amount,
                issued_at,
                plan.voucher_validity_days,
                "tier",
                f"{tier.percent}% for a {days}-day rental (tier >= {tier.min_days} days)",
            )
        )
    return entries


def open_vouchers(entries: Iterable[VoucherEntry]) -> list[OpenVoucher]:
    issued: dict[str, VoucherEntry] = {}
    used: dict[str, Decimal] = defaultdict(Decimal)
    for entry in entries:
        if entry.kind is EntryKind.ISSUED:
            issued[entry.voucher_id] = entry
        else:
            used[entry.voucher_id] += entry.amount
    result = []
    for vid, e in issued.items():
        assert e.expires_at is not None  # enforced by VoucherEntry.__post_init__
        if e.amount > used[vid]:
            result.append(OpenVoucher(vid, e.customer_id, e.expires_at, e.amount - used[vid]))
    return result


def apply_vouchers(
    vouchers: Sequence[OpenVoucher], amount_due: Decimal, as_of: int, invoice_id: str
) -> tuple[list[VoucherEntry], list[VoucherEntry]]:
    applications: list[VoucherEntry] = []
    expirations: list[VoucherEntry] = []
    due = amount_due
    for v in sorted(vouchers, key=lambda v: (v.expires_at, v.voucher_id)):
        if v.remaining <= 0:
            continue
        if v.expires_at <= as_of:
            expirations.append(
                VoucherEntry(
                    EntryKind.EXPIRED, v.voucher_id, v.customer_id, v.remaining, v.expires_at
                )
            )
        elif due > 0:
            taken = min(v.remaining, due)
            due -= taken
            applications.append(
                VoucherEntry(
                    EntryKind.APPLIED,
                    v.voucher_id,
                    v.customer_id,
                    taken,
                    as_of,
                    invoice_id=invoice_id,
                )
            )
    return applications, expirations


def balance(entries: Iterable[VoucherEntry]) -> Decimal:
    """Issued - applied - expired over all entries (>= 0 when written by these rules)."""
    total = Decimal(0)
    for entry in entries:
        total += entry.amount if entry.kind is EntryKind.ISSUED else -entry.amount
    return total


def usable(vouchers: Iterable[OpenVoucher], as_of: int) -> Decimal:
    """What is left of the vouchers not expired at ``as_of`` (what an invoice could take)."""
    return sum((v.remaining for v in vouchers if v.expires_at > as_of), Decimal(0))


def family(voucher_id: str, entries: Iterable[VoucherEntry]) -> list[VoucherEntry]:
    """The entries of a voucher and of those reissued from it (their ids end in ``:<id>``)."""
    return [
        e for e in entries if e.voucher_id == voucher_id or e.voucher_id.endswith(f":{voucher_id}")
    ]


def take_back(
    earned: Iterable[VoucherEntry],
    entries: Sequence[VoucherEntry],
    at: int,
    invoice_id: str,
    reason: str,
) -> list[VoucherEntry]:
    """``revoked`` entries for what is left of the ``earned`` vouchers and their reissues."""
    related = [e for voucher in earned for e in family(voucher.voucher_id, entries)]
    return [
        VoucherEntry(
            EntryKind.REVOKED,
            v.voucher_id,
            v.customer_id,
            v.remaining,
            at,
            reason=reason,
            invoice_id=invoice_id,
        )
        for v in open_vouchers(related)
    ]


def earned_again(
    tier: Iterable[VoucherEntry],
    voided: Sequence[VoucherEntry],
    entries: Sequence[VoucherEntry],
    void_invoice_ids: Collection[str],
    invoice_id: str,
) -> list[VoucherEntry]:
    """A replacement invoice's ``tier`` vouchers: those whose rental and period a voided
    invoice earned (``voided``, its issued tier entries) under an id of this invoice, less
    what was spent of the voided ones on invoices that are not void; none left, none issued."""
    again = []
    for voucher in tier:
        before = [
            v
            for v in voided
            if v.voucher_id.startswith(f"{voucher.voucher_id}:")
            or v.voucher_id == voucher.voucher_id
        ]
        if not before:
            again.append(voucher)
            continue
        spent = sum(
            (
                e.amount
                for v in before
                for e in family(v.voucher_id, entries)
                if e.kind is EntryKind.APPLIED and e.invoice_id not in void_invoice_ids
            ),
            Decimal(0),
        )
        if (amount := voucher.amount - spent) > 0:
            used = f", less {spent.normalize():f} already used of a voided invoice's voucher"
            reason = voucher.reason + (used if spent else "")
            voucher_id = f"{voucher.voucher_id}:{invoice_id}"
            again.append(
                dataclasses.replace(voucher, voucher_id=voucher_id, amount=amount, reason=reason)
            )
    return again
