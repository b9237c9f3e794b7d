"""Published cases ``gpumeter simulate --scenario`` replays, with their inputs and sources.

Each scenario states its inputs and where they come from; ``expected`` is the arithmetic a
reader can do on those inputs alone, printed next to what the stored data rates to.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction

from app.core.epoch import epoch

HOUR = 3600
DAY = 86_400
WINDOW_START = epoch(datetime(2026, 1, 1, tzinfo=UTC))  # fixed: a seed replays the same data


@dataclass(frozen=True, slots=True)
class RootCause:
    component: str
    category: str
    count: int
    published_percent: str


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    gpus: int
    days: int
    model: str  # NVML device name
    price_per_hour: str  # USD per GPU-hour
    failures_per_gpu_day: Fraction
    idle_share: Fraction  # of rented GPU-hours
    manual_recovery_s: int
    auto_window_s: tuple[int, int]  # failover to a hot spare, uniform
    sources: tuple[str, ...]
    root_causes: tuple[RootCause, ...] = ()

    def scaled(self, scale: float) -> int:
        """The GPU count at ``scale`` (at least one)."""
        return max(1, round(self.gpus * scale))


SEED = Scenario(
    name="seed",
    title="the seed article: one customer, 3,000 A100 80 GB for 60 days",
    gpus=3000,
    days=60,
    model="NVIDIA A100-SXM4-80GB",
    price_per_hour="2.80",
    failures_per_gpu_day=Fraction(72, 10_000),  # 0.72 % per GPU per day
    idle_share=Fraction(184, 1000),
    manual_recovery_s=47 * 60,
    auto_window_s=(25, 35),  # ~30 s to a hot spare
    sources=(
        "inputs as the brief quotes the seed article (a blog post on per-second GPU billing and "
        "failures); the article itself, and so its own result table, was not found by search "
        "(pages corpus, three queries): only the arithmetic on its inputs is checked below",
    ),
)

# Table of root causes of unexpected interruptions, 54-day Llama 3 405B pre-training snapshot
# (Llama 3 paper, "The Llama 3 Herd of Models", 2024), as republished by
# glennklockwood.com/garden/component-reliability and DatacenterDynamics.
LLAMA3_ROOT_CAUSES = (
    RootCause("Faulty GPU", "GPU", 148, "30.1"),
    RootCause("GPU HBM3 Memory", "GPU", 72, "17.2"),
    RootCause("Software Bug", "Dependency", 54, "12.9"),
    RootCause("Network Switch/Cable", "Network", 35, "8.4"),
    RootCause("Host Maintenance", "Unplanned Maintenance", 32, "7.6"),
    RootCause("GPU SRAM Memory", "GPU", 19, "4.5"),
    RootCause("GPU System Processor", "GPU", 17, "4.1"),
    RootCause("NIC", "Host", 7, "1.7"),
    RootCause("NCCL Watchdog Timeouts", "Unknown", 7, "1.7"),
    RootCause("Silent Data Corruption", "GPU", 6, "1.4"),
    RootCause("GPU Thermal Interface + Sensor", "GPU", 6, "1.4"),
    RootCause("SSD", "Host", 3, "0.7"),
    RootCause("Power Supply", "Host", 3, "0.7"),
    RootCause("Server Chassis", "Host", 2, "0.5"),
    RootCause("IO Expansion Board", "Host", 2, "0.5"),
    RootCause("Dependency", "Dependency", 2, "0.5"),
    RootCause("CPU", "Host", 2, "0.5"),
    RootCause("System Memory", "Host", 2, "0.5"),
)

LLAMA3 = Scenario(
    name="llama3",
    title="Llama 3 405B pre-training: 16,384 H100 80 GB for 54 days, 419 unexpected interruptions",
    gpus=16_384,
    days=54,
    model="NVIDIA H100 80GB HBM3",
    price_per_hour="2.49",  # the simulator's on-demand H100 price (app.simulate.fleet.MODELS)
    failures_per_gpu_day=Fraction(419, 16_384 * 54),
    idle_share=Fraction(
        1, 10
    ),  # Meta: "more than 90 % effective training time"; the rest taken as idle
    manual_recovery_s=47 * 60,  # the seed article's manual recovery, for comparison
    auto_window_s=(25, 35),
    sources=(
        "Llama 3 paper (The Llama 3 Herd of Models, 2024), section on reliability: 466 job "
        "interruptions in a 54-day snapshot on 16,384 H100s, 47 planned and 419 unexpected; "
        "'more than 90 % effective training time'; 3 needed significant manual intervention",
        "price 2.49 USD/GPU-h is this simulator's H100 on-demand price, not Meta's cost",
        "every unexpected interruption is replayed as a fatal failure of one GPU (the paper "
        "counts job interruptions, not GPUs; software and network causes would not mark a GPU "
        "failed, so a per-GPU meter would credit fewer of them)",
    ),
    root_causes=LLAMA3_ROOT_CAUSES,
)

SCENARIOS = {s.name: s for s in (SEED, LLAMA3)}


@dataclass(frozen=True, slots=True)
class Expected:
    """What the inputs alone imply for ``gpus`` GPUs (means; the stored history is a draw)."""

    rented_gpu_h: Fraction
    failures: Fraction
    manual_downtime_gpu_h: Fraction
    auto_downtime_gpu_h: Fraction
    idle_gpu_h: Fraction
    cost_all_rented: Decimal  # every rented second at the price


def expected(scenario: Scenario, gpus: int) -> Expected:
    gpu_days = gpus * scenario.days
    failures = gpu_days * scenario.failures_per_gpu_day
    auto_mean_s = Fraction(sum(scenario.auto_window_s), 2)
    rented = Fraction(gpu_days * 24)
    return Expected(
        rented_gpu_h=rented,
        failures=failures,
        manual_downtime_gpu_h=failures * scenario.manual_recovery_s / HOUR,
        auto_downtime_gpu_h=failures * auto_mean_s / HOUR,
        idle_gpu_h=rented * scenario.idle_share,
        cost_all_rented=Decimal(gpu_days * 24) * Decimal(scenario.price_per_hour),
    )
