"""Input and output value types of the pure billing core (no DB, no web).

Times are integer UTC epoch seconds; every interval is half-open [start, end).
Money is ``Decimal``; prices are per GPU-hour with at most 10 decimal places.

Inputs:  Assignment, Segment, Migration, PricePoint, VoucherTier, PlanTerms, RentalInput,
         RatingInputs (all of them for some rentals over a period)
Outputs: Bucket, Piece (a classified rented interval), RentalSession
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum

from app.billing.core.intervals import Span
from app.core.money import minor_units

# Segment states are the agent's (wire format), re-exported for the billing core.
from metering_agent.protocol import GpuState as GpuState

Evidence = Mapping[str, object]

MAX_PRICE_DECIMALS = 10


class Bucket(StrEnum):
    """Where a rented GPU-second goes; listed in precedence order."""

    MIGRATION_CREDIT = "migration_credit"
    MAINTENANCE = "maintenance"
    FAILURE_CREDIT = "failure_credit"
    UNMETERED = "unmetered"
    # Another GPU of the rental is failed or migrating: the job cannot run (``credit_stall``).
    STALL_CREDIT = "stall_credit"
    DEGRADED = "degraded"
    DEGRADED_CREDIT = "degraded_credit"
    BILLABLE = "billable"


# Seconds in these buckets are charged and then credited back on their own negative lines.
CREDIT_BUCKETS = frozenset(
    {Bucket.MIGRATION_CREDIT, Bucket.FAILURE_CREDIT, Bucket.DEGRADED_CREDIT, Bucket.STALL_CREDIT}
)
# Seconds the job could not run for the provider's fault: a failed GPU, a migration window, and
# the rental's other GPUs meanwhile (automatic credits, as opposed to a plan's degraded credit).
DOWNTIME_BUCKETS = frozenset({Bucket.FAILURE_CREDIT, Bucket.MIGRATION_CREDIT, Bucket.STALL_CREDIT})


def _check_interval(start: int, end: int) -> None:
    if start > end:
        raise ValueError(f"interval ends before it starts: [{start}, {end})")


@dataclass(frozen=True)
class Assignment:
    """The control plane's record that ``rental_id`` held ``gpu_uuid`` over [start, end)."""

    rental_id: str
    gpu_uuid: str
    start: int
    end: int

    def __post_init__(self) -> None:
        _check_interval(self.start, self.end)


@dataclass(frozen=True)
class Segment:
    """A GPU's own health report for [start, end); ``evidence`` refers to the health event."""

    gpu_uuid: str
    start: int
    end: int
    state: GpuState
    evidence: Evidence | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        _check_interval(self.start, self.end)


@dataclass(frozen=True)
class Migration:
    """Rental moved from ``from_gpu`` to ``to_gpu``; [failed_at, resumed_at) is the window."""

    rental_id: str
    from_gpu: str
    to_gpu: str
    failed_at: int
    resumed_at: int
    evidence: Evidence | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        _check_interval(self.failed_at, self.resumed_at)


@dataclass(frozen=True)
class PricePoint:
    """Price per GPU-hour of ``gpu_model`` from ``effective_from`` until the next point, and
    the model's monthly cap per GPU over the same time (None: that price is not capped)."""

    gpu_model: str
    effective_from: int
    price_per_hour: Decimal
    monthly_cap_per_gpu: Decimal | None = None

    def __post_init__(self) -> None:
        exponent = self.price_per_hour.as_tuple().exponent
        if not isinstance(exponent, int) or exponent < -MAX_PRICE_DECIMALS:
            raise ValueError(f"price must be finite with <= 10 decimals: {self.price_per_hour}")
        if self.price_per_hour < 0:
            raise ValueError("price must not be negative")
        if self.monthly_cap_per_gpu is not None and self.monthly_cap_per_gpu <= 0:
            raise ValueError("a monthly cap must be positive")


@dataclass(frozen=True)
class VoucherTier:
    """A rental running at least ``min_days`` earns ``percent`` % of its net charge."""

    min_days: int
    percent: Decimal


@dataclass(frozen=True)
class PlanTerms:
    prices: tuple[PricePoint, ...]
    currency: str = "USD"
    increment_s: int = 1
    minimum_s: int = 1
    bill_degraded: bool = True
    bill_unmetered: bool = False
    credit_stall: bool = True  # a failure credits the rental's other GPUs until the job runs
    voucher_tiers: tuple[VoucherTier, ...] = ()
    voucher_validity_days: int = 90

    def __post_init__(self) -> None:
        minor_units(self.currency)  # fail early on an unknown currency
        if self.increment_s < 1 or self.minimum_s < 0:
            raise ValueError("increment must be >= 1 s and minimum >= 0 s")

    def price_points(self, gpu_model: str) -> tuple[PricePoint, ...]:
        points = sorted(
            (p for p in self.prices if p.gpu_model == gpu_model), key=lambda p: p.effective_from
        )
        if not points:
            raise ValueError(f"plan has no price for GPU model {gpu_model!r}")
        return tuple(points)


@dataclass(frozen=True)
class RentalInput:
    rental_id: str
    customer_id: str
    gpu_model: str
    gpu_count: int
    rental_start: int
    rental_end: int | None
    plan: PlanTerms

    def end_by(self, time: int) -> int:
        """When the rental stops running, counting no further than ``time``."""
        return time if self.rental_end is None else min(self.rental_end, time)


@dataclass(frozen=True)
class RatingInputs:
    """What rating reads: the rentals, their GPUs' assignments and migrations, and each GPU's
    segments and maintenance, over ``period``."""

    rentals: Sequence[RentalInput]
    assignments: Sequence[Assignment]
    segments_by_gpu: Mapping[str, Sequence[Segment]]
    maintenance_by_gpu: Mapping[str, Sequence[Span]]
    migrations: Sequence[Migration]
    period: Span


@dataclass(frozen=True)
class Piece:
    """A maximal rented interval of one GPU slot with a single bucket.

    ``session`` is the start of the assignment run it belongs to (None for migration windows);
    ``evidence`` is the first failed/degraded segment's evidence, or the migration's.
    """

    gpu_uuid: str
    start: int
    end: int
    bucket: Bucket
    session: int | None
    evidence: Evidence | None = field(default=None, hash=False)

    @property
    def seconds(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class RentalSession:
    """One assignment run on one GPU, clipped to the period, with its increment rounding."""

    gpu_uuid: str
    start: int
    end: int
    billed_s: int  # seconds in billed buckets, before rounding
    # billed_s plus the rounding of billed and credited seconds together up to the increment
    # and the minimum (0 when nothing is billed)
    charged_s: int
    extra_priced_at: int | None  # the rounding's seconds are priced at this second

    @property
    def extra_s(self) -> int:
        return self.charged_s - self.billed_s
