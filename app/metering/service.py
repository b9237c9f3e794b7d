"""Ingest: validate a node's batch, then store it whole, in the request's one transaction.

Per batch: checks (types by the schema, then semantics) -> one pipeline (node lock, then the
batch's stored segments and metric rows) -> ownership (register new GPUs; the items of GPUs in
a UUID clash held or refused, each answered, the rest stored) -> judge records against
stored segments (``segments``: duplicate / new / conflict; 409) ->
one pipeline writing segments, minute metrics, health events and evidence -> the GPUs' last
state (and ``gpu.state_changed`` events). Any error raises before the commit, so a batch is
stored whole or not at all. A steady batch costs five round trips to Postgres (the first
pipeline with its BEGIN, owners, the writes, last state, COMMIT); it used to cost fourteen.

Late data: segments carry ``received_at``, set to the transaction time whenever telemetry
creates or changes the row (insert, extension, merge). A record that lands in a period whose
invoice is already finalized therefore leaves a segment overlapping that period with
``received_at`` after the finalization; the billing engine looks for exactly that
(``reads.late_segments_since``), re-rates the period and bills the difference as an
adjustment on the next invoice. Any age within ``ingest_retention_days`` is accepted.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from app.core.db import Statement, pipelined
from app.core.epoch import from_epoch
from app.core.errors import ApiError, Conflict, PayloadTooLarge, Unprocessable
from app.events.service import publish
from app.metering import packing, repository
from app.metering.ports import Claim, GpuRegistry, LatestReport

# Ingest's own writers, which the simulator writes its history with (app.simulate.store).
from app.metering.repository import attach_evidence as attach_evidence
from app.metering.repository import insert_events as insert_events
from app.metering.repository import write_metric_rows as write_metric_rows
from app.metering.repository import write_segments as write_segments
from app.metering.segments import Judgement, Span, changes, judge, merge
from app.metering.validation import batch_errors
from app.settings import Settings
from metering_agent.protocol import (
    FieldError,
    GpuState,
    HealthEvent,
    IngestBatch,
    IngestResult,
    ItemAnswer,
    UsageRecord,
    Withheld,
)

log = logging.getLogger(__name__)
UNKNOWN_MODEL = "unknown"  # a GPU first seen in an event; its first record names the model


@dataclass(frozen=True, slots=True)
class NodeBatch:
    """A node's batch that passed ``check_batch``."""

    node_id: uuid.UUID
    batch: IngestBatch


def ingest(
    session: Session,
    node_id: uuid.UUID,
    batch: IngestBatch,
    settings: Settings,
    gpus: GpuRegistry,
) -> IngestResult:
    """Check a node's batch and store it whole; what is wrong with it raises (4xx)."""
    check_batch(batch, settings, int(time.time()))
    return store_alone(session, NodeBatch(node_id, batch), gpus)


def store_alone(session: Session, item: NodeBatch, gpus: GpuRegistry) -> IngestResult:
    """Store a checked batch: it registers GPUs new to the service; the items of GPUs of
    other nodes, in dispute or retired are held or refused (``_admit``), each answered in
    ``not_stored``; records that contradict stored seconds and re-sent events with other
    content (409) raise, and then nothing is stored."""
    [result] = _store_batches(session, [item], gpus, alone=True)
    assert result is not None  # alone, a batch is stored or raises
    return result


def store_together(
    session: Session, group: Sequence[NodeBatch], gpus: GpuRegistry
) -> list[IngestResult | None]:
    """Store checked batches of distinct nodes in one transaction (group commit): the same
    statements as one batch's, over all of them. ``None`` for each batch that must be stored
    alone, of which nothing was written: one carrying health events, registering GPUs,
    naming GPUs not its node's (or in dispute) or contradicting stored seconds (the cases
    with side effects or errors of their own; a steady agent's batch has none of them)."""
    return _store_batches(session, group, gpus, alone=False)


def _store_batches(
    session: Session, group: Sequence[NodeBatch], gpus: GpuRegistry, *, alone: bool
) -> list[IngestResult | None]:
    results: list[IngestResult | None] = [None] * len(group)
    live = [i for i, item in enumerate(group) if alone or not item.batch.events]
    if not live:
        return results
    answers: list[ItemAnswer] = []
    spans = {i: _spans_by_gpu(group[i].batch.records) for i in live}
    records = [r for i in live for r in group[i].batch.records]
    windows = _windows(spans.values())
    metric_keys = list({(r.gpu_uuid, packing.hour_of(r.start)) for r in records})
    _, near, metrics = pipelined(
        session,
        [
            repository.lock_nodes_statement([group[i].node_id for i in live]),
            repository.segments_near_statement(windows) if windows else None,
            repository.metric_rows_statement(metric_keys, _newest_hours(records))
            if metric_keys
            else None,
        ],
    )
    stored = repository.spans_by_gpu(near)
    segment_writes = _SegmentWrites()
    judged: dict[int, Judgement] = {}
    if alone:
        admitted, answers = _admit(session, group[0], gpus)
        if answers:  # only the batch's own GPUs' records are judged and stored
            group, spans = [admitted], {0: _spans_by_gpu(admitted.batch.records)}
        owned = live
    else:
        owned = _owned(session, group, live, gpus)
    for i in owned:
        judgement, writes = _judge(stored, spans[i])
        if judgement.conflicts:
            if alone:
                raise _conflict(group[i].batch, judgement)
            continue
        segment_writes.add(writes)
        judged[i] = judgement
    if not judged:
        return results
    batches = {i: group[i].batch for i in judged}
    accepted = [batches[i].records[j] for i, jg in judged.items() for j in jg.accepted]
    events = [e for batch in batches.values() for e in batch.events]  # alone only
    metric_writes = _metric_writes(repository.stored_metrics(metrics), accepted)
    events_new = _store(
        session, events, segment_writes.statements() + metric_writes, segment_writes.created
    )
    latest = _latest([r for batch in batches.values() for r in batch.records])
    if latest:
        _publish_state_changes(session, gpus.record_latest(session, latest), events)
    for i, jg in judged.items():
        results[i] = IngestResult(
            batch_id=batches[i].batch_id,
            accepted=len(jg.accepted),
            duplicates=len(jg.duplicates),
            events_accepted=events_new,
            events_duplicate=len(batches[i].events) - events_new,
            not_stored=answers,
        )
    return results


def check_batch(batch: IngestBatch, settings: Settings, now: int) -> None:
    """Raise listing every bad item (index and field) of a batch whose types already parsed."""
    size = len(batch.records) + len(batch.events)
    if size > settings.ingest_max_items:
        raise PayloadTooLarge(
            f"a batch may carry at most {settings.ingest_max_items} records plus events; "
            f"this one has {size}; split it",
            ["body"],
        )
    errors = batch_errors(batch, settings, now)
    if errors:
        raise Unprocessable.many(_items(errors))


def _items(errors: Iterable[FieldError]) -> list[dict[str, object]]:
    return [{"loc": ["body", *e.loc], "msg": e.msg} for e in errors]


def _owned(
    session: Session, group: Sequence[NodeBatch], live: list[int], gpus: GpuRegistry
) -> list[int]:
    """The live batches whose GPUs are all their node's; a batch naming any GPU not yet its
    node's (or in dispute) is left out, to be stored alone."""
    models = {i: _models(group[i].batch) for i in live}
    owners = gpus.owners(session, {gpu for named in models.values() for gpu in named})
    return [i for i in live if all(owners.get(g) == group[i].node_id for g in models[i])]


def _admit(
    session: Session, item: NodeBatch, gpus: GpuRegistry
) -> tuple[NodeBatch, list[ItemAnswer]]:
    """A batch stored alone: it registers GPUs new to the service to its node; the items of
    GPUs that are not its node's (another node's, in dispute or retired) are held or refused,
    each with its answer, and the rest of the batch is stored. No clash, no cost: one query."""
    node_id, batch = item.node_id, item.batch
    models = _models(batch)
    owners = gpus.owners(session, models)
    new = {gpu: model for gpu, model in models.items() if gpu not in owners}
    if new:
        gpus.register(session, node_id, new)
        owners.update(gpus.owners(session, new))  # another node may have won a race
    others = [gpu for gpu in models if owners[gpu] != node_id]
    claims = gpus.claims(session, node_id, others, batch.batch_id) if others else {}
    if not claims:
        return item, []
    answers = _withhold(session, node_id, batch, claims, gpus.hold_max)
    kept = IngestBatch(
        batch_id=batch.batch_id,
        records=[r for r in batch.records if r.gpu_uuid not in claims],
        events=[e for e in batch.events if e.gpu_uuid not in claims],
        protocol_version=batch.protocol_version,
    )
    return NodeBatch(node_id, kept), answers


def _withhold(
    session: Session,
    node_id: uuid.UUID,
    batch: IngestBatch,
    claims: dict[str, Claim],
    hold_max: int,
) -> list[ItemAnswer]:
    """Hold the items of the GPUs whose claims are held, up to ``hold_max`` per GPU (then
    refused, saying so); refuse the others with their claim's reason."""
    room = {gpu: hold_max - count for gpu, count in repository.held_counts(session, claims).items()}
    items: list[tuple[str, int, str, UsageRecord | HealthEvent]] = [
        ("records", i, r.gpu_uuid, r) for i, r in enumerate(batch.records)
    ]
    items += [("events", i, e.gpu_uuid, e) for i, e in enumerate(batch.events)]
    answers, held = [], []
    for kind, i, gpu, value in items:
        claim = claims.get(gpu)
        if claim is None:
            continue
        outcome, reason = Withheld.REFUSED, claim.reason
        if claim.held and room.setdefault(gpu, hold_max) > 0:
            room[gpu] -= 1
            outcome = Withheld.HELD
            held.append((gpu, HELD_KINDS[kind], _WIRE[kind].dump_python(value, mode="json")))
        elif claim.held:
            reason = (
                f"GPU {gpu} is in dispute and its hold is full ({hold_max} items, "
                "GPUMETER_INGEST_HOLD_MAX); an operator must settle the clash"
            )
        answers.append(ItemAnswer((kind, i), gpu, outcome, reason))
    if held:
        repository.hold(session, node_id, held)
    refused = sum(a.outcome is Withheld.REFUSED for a in answers)
    if refused:
        log.warning(
            "ingest refused %d items of node %s (GPU UUID clash): %s",
            refused,
            node_id,
            sorted({a.reason for a in answers if a.outcome is Withheld.REFUSED}),
        )
    return answers


HELD_KINDS = {"records": "record", "events": "event"}
_WIRE: dict[str, TypeAdapter[Any]] = {
    "records": TypeAdapter(UsageRecord),
    "events": TypeAdapter(HealthEvent),
}


@dataclass(frozen=True)
class Refusal:
    """Held items of one node, refused when a clash was settled."""

    node_id: uuid.UUID
    records: int
    events: int
    reason: str


def release_held(
    session: Session, gpu_uuid: str, owner: uuid.UUID | None, reason: str, gpus: GpuRegistry
) -> tuple[IngestResult | None, list[Refusal]]:
    """Settle a GPU's held items (its registry already says who owns it): those of ``owner``
    are stored as a batch of theirs would be, those contradicting stored seconds excepted;
    the others are refused for ``reason``. What was stored, and what was refused and why."""
    taken = repository.take_held(session, gpu_uuid)
    kinds: dict[uuid.UUID, list[str]] = defaultdict(list)
    for node, kind, _ in taken:
        kinds[node].append(kind)
    mine = [(kind, item) for node, kind, item in taken if node == owner]
    refusals = [
        Refusal(node, k.count("record"), k.count("event"), reason)
        for node, k in sorted(kinds.items())
        if node != owner
    ]
    if owner is None or not mine:
        return None, refusals
    batch = IngestBatch(
        batch_id=f"held-{gpu_uuid}",
        records=[_WIRE["records"].validate_python(i) for k, i in mine if k == "record"],
        events=[_WIRE["events"].validate_python(i) for k, i in mine if k == "event"],
    )
    result, contradicting = _store_what_fits(session, NodeBatch(owner, batch), gpus)
    if contradicting:
        records = sum(kind == "records" for kind, _ in contradicting)
        why = "; ".join(sorted({msg for _, msg in contradicting})[:3])
        refusals.append(
            Refusal(owner, records, len(contradicting) - records, f"contradicts stored: {why}")
        )
    return result, refusals


def _store_what_fits(
    session: Session, item: NodeBatch, gpus: GpuRegistry
) -> tuple[IngestResult, list[tuple[str, str]]]:
    """Store the batch alone, leaving out the items that contradict what is stored (each
    try in a savepoint); the result and the (kind, message) of each item left out."""
    left_out: list[tuple[str, str]] = []
    batch = item.batch
    while True:
        try:
            with session.begin_nested():
                return store_alone(session, NodeBatch(item.node_id, batch), gpus), left_out
        except Conflict as conflict:
            bad = {(str(e["loc"][1]), int(e["loc"][2])): str(e["msg"]) for e in conflict.items}
            if not bad:  # nothing to leave out: it is not one of the items' conflicts
                raise
            left_out += [(kind, msg) for (kind, _), msg in bad.items()]
            batch = IngestBatch(
                batch_id=batch.batch_id,
                records=[r for i, r in enumerate(batch.records) if ("records", i) not in bad],
                events=[e for i, e in enumerate(batch.events) if ("events", i) not in bad],
            )


def _models(batch: IngestBatch) -> dict[str, str]:
    """The batch's GPUs and their models (a GPU named by events only: ``unknown``)."""
    models = {r.gpu_uuid: r.model for r in batch.records}
    models.update({e.gpu_uuid: UNKNOWN_MODEL for e in batch.events if e.gpu_uuid not in models})
    return models


def _spans_by_gpu(records: list[UsageRecord]) -> dict[str, list[tuple[int, Span]]]:
    """Each GPU's records as (batch index, span), sorted by start."""
    by_gpu: dict[str, list[tuple[int, Span]]] = defaultdict(list)
    for i, r in enumerate(records):
        by_gpu[r.gpu_uuid].append((i, Span(r.start, r.end, str(r.state))))
    for spans in by_gpu.values():
        spans.sort(key=lambda item: item[1].start)
    return by_gpu


def _windows(
    batches: Iterable[dict[str, list[tuple[int, Span]]]],
) -> dict[str, tuple[int, int]]:
    """Each GPU's first start and last end over the batches' records."""
    windows: dict[str, tuple[int, int]] = {}
    for by_gpu in batches:
        for gpu, spans in by_gpu.items():
            lo, hi = spans[0][1].start, max(s.end for _, s in spans)
            if gpu in windows:
                lo, hi = min(lo, windows[gpu][0]), max(hi, windows[gpu][1])
            windows[gpu] = (lo, hi)
    return windows


@dataclass(slots=True)
class _SegmentWrites:
    upserts: list[tuple[str, Span]] = field(default_factory=list)
    deletes: list[tuple[str, int]] = field(default_factory=list)
    created: list[tuple[str, int]] = field(default_factory=list)  # where a run begins

    def add(self, other: _SegmentWrites) -> None:
        self.upserts += other.upserts
        self.deletes += other.deletes
        self.created += other.created

    def statements(self) -> list[Statement | None]:
        return [
            repository.segment_deletes_statement(self.deletes),
            repository.segment_upserts_statement(self.upserts),
        ]


def _judge(
    stored: dict[str, list[Span]], by_gpu: dict[str, list[tuple[int, Span]]]
) -> tuple[Judgement, _SegmentWrites]:
    """Judge a batch's records against the stored segments: the verdicts, and the segment
    writes (to be used only if nothing conflicts)."""
    judgement = Judgement()
    writes = _SegmentWrites()
    for gpu, spans in by_gpu.items():
        before = stored.get(gpu, [])
        delta = changes(before, merge(judge(before, spans, judgement)))
        writes.upserts += [(gpu, s) for s in delta.upserts]
        writes.deletes += [(gpu, start) for start in delta.deletes]
        writes.created += [(gpu, start) for start in delta.created]
    return judgement, writes


def _conflict(batch: IngestBatch, judgement: Judgement) -> ApiError:
    return Conflict.many(
        [
            {"loc": ["body", "records", i], "msg": msg, "gpu_uuid": batch.records[i].gpu_uuid}
            for i, msg in judgement.conflicts
        ]
    )


def _newest_hours(records: list[UsageRecord]) -> dict[str, repository.NewestHour]:
    """Per GPU: the hour of its newest records and the span of slots they touch, that of the
    hour before's records, and whether it has records of no other hour (what ingest reads of
    its open row: ``repository.metric_rows_statement``)."""
    by_hour: dict[str, dict[int, list[UsageRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by_hour[r.gpu_uuid][packing.hour_of(r.start)].append(r)
    newest = {}
    for gpu, hours in by_hour.items():
        hour = max(hours)
        before = hours.get(hour - packing.HOUR)
        newest[gpu] = repository.NewestHour(
            hour,
            *packing.span_bounds(hours[hour]),
            previous=None if before is None else packing.span_bounds(before),
            two_hours_at_most=len(hours) <= 1 + (before is not None),
        )
    return newest


def _mem_total(records: Iterable[UsageRecord]) -> int | None:
    return next((r.mem_total_mib for r in records if r.mem_total_mib is not None), None)


def _metric_writes(
    stored: repository.StoredMetrics, records: list[UsageRecord]
) -> list[Statement | None]:
    """Combine the records into their GPU-hour rows (read-modify-write; safe: the node lock is
    held). Each GPU's newest hour not yet closed is its open row; an open row of an older hour
    moves to the closed table, as do records of older hours. The steady case, records landing
    in the open row's own hour, reads and rewrites only the span of slots they touch; so does
    an hour's turn, the open row closed in SQL (``repository.open_hours_roll_statement``)."""
    if not records:
        return []
    by_row: dict[tuple[str, int], list[UsageRecord]] = defaultdict(list)
    for r in records:
        by_row[(r.gpu_uuid, packing.hour_of(r.start))].append(r)
    spans, rolls = _span_writes(stored.spans, by_row)
    # Per GPU: hour -> (slots, mem_total) as they will be written, starting from its open row.
    rows: dict[str, dict[int, tuple[bytes, int | None]]] = defaultdict(dict)
    for gpu, (hour, open_slots, open_mem_total) in stored.open.items():
        rows[gpu][hour] = (open_slots, open_mem_total)  # left as is unless a record lands
    for (gpu, hour), rs in by_row.items():
        slots, mem_total = rows[gpu].get(hour) or (stored.closed.get((gpu, hour)), None)
        mem_new = _mem_total(rs)
        rows[gpu][hour] = (
            packing.add_records(slots or packing.EMPTY_ROW, rs),
            mem_total if mem_new is None else mem_new,
        )
    opened: dict[tuple[str, int], tuple[bytes, int | None]] = {}
    closed: dict[tuple[str, int], tuple[bytes, int | None]] = {}
    for gpu, hours in rows.items():
        # A GPU whose open row is of its newest hour (a span) keeps it open: the rest close.
        newest = None
        if gpu not in stored.spans:
            newest = max((h for h in hours if (gpu, h) not in stored.closed), default=None)
        for hour, row in hours.items():
            if hour != newest:
                closed[(gpu, hour)] = row
            elif (gpu, hour) in by_row:  # an open row that stays and got nothing is left as is
                opened[(gpu, hour)] = row
    return [
        repository.metric_rows_write_statement(closed, closed=True),
        repository.metric_rows_write_statement(opened, closed=False),
        repository.open_spans_write_statement(spans),
        repository.open_hours_roll_statement(rolls),
    ]


def _span_writes(
    stored: dict[str, repository.OpenSpan], by_row: dict[tuple[str, int], list[UsageRecord]]
) -> tuple[dict[str, tuple[int, int, bytes, int | None]], dict[str, repository.Roll]]:
    """The spans of open rows the records land in, and the rows that close as their GPU's
    newest hour opens (rolls); the records they take are removed from ``by_row``."""
    spans: dict[str, tuple[int, int, bytes, int | None]] = {}
    rolls: dict[str, repository.Roll] = {}
    for gpu, span in stored.items():
        rs = by_row.pop((gpu, span.hour), [])  # none: those records were all duplicates
        previous, before = span.previous, []
        if previous is not None:  # a rolling row, of the hour before: its records go in
            before = by_row.pop((gpu, span.hour - packing.HOUR), [])
            previous = (previous[0], packing.add_records(previous[1], before, previous[0]))
        if not rs and not before:
            continue
        slots = packing.add_records(span.slots, rs, span.first)
        if span.rolls:
            rolls[gpu] = repository.Roll(
                span.hour, span.first, slots, _mem_total(rs), previous, _mem_total(before)
            )
        else:
            spans[gpu] = (span.hour, span.first, slots, _mem_total(rs))
    return spans, rolls


def _store(
    session: Session,
    events: list[HealthEvent],
    writes: list[Statement | None],
    created: list[tuple[str, int]],
) -> int:
    """Run the writes in one pipeline: segments, minute metrics, then the events (of a batch
    stored alone: ids are per GPU; an id re-sent with other content is a conflict) and the
    evidence linking state-change events to the segments they began, whichever arrived first.
    Returns how many events were new."""
    statements = repository.event_statements(events) if events else (None, None)
    keys = {(e.gpu_uuid, e.at) for e in events if e.state is not None} | set(created)
    results = pipelined(
        session, [*writes, *statements, repository.attach_evidence_statement(sorted(keys))]
    )
    inserted, conflicts = results[len(writes)], results[len(writes) + 1]
    if conflicts:
        raise Conflict.many(
            [
                {
                    "loc": ["body", "events", i, "event_id"],
                    "msg": f"event {events[i].event_id} of GPU {events[i].gpu_uuid} "
                    "was already stored with different content",
                    "gpu_uuid": events[i].gpu_uuid,
                }
                for (i,) in conflicts
            ]
        )
    return len(inserted)


def _publish_state_changes(
    session: Session,
    changed: list[tuple[str, str | None, str, int]],
    health_events: list[HealthEvent],
) -> None:
    """``gpu.state_changed`` for each GPU that moved to another state, with the batch's health
    events of that GPU as evidence. A GPU first seen healthy has not changed.

    In time order, then by GPU: the changes come in the order Postgres found the rows (which
    moves as rows are rewritten), and the failover hands out spares in event order, so two
    GPUs failing in the same second get the same spares every time."""
    for gpu, before, now, seen in sorted(changed, key=lambda change: (change[3], change[0])):
        if before is None and now == GpuState.HEALTHY:
            continue
        change = "recovered" if now == GpuState.HEALTHY else now
        evidence = [_evidence(e) for e in health_events if e.gpu_uuid == gpu]
        data = {
            "gpu_uuid": gpu,
            "change": change,
            "from_state": before,
            "to_state": now,
            "seen_at": from_epoch(seen).isoformat(),
            "evidence": evidence,
        }
        publish(session, "gpu.state_changed", data, subject=f"gpu/{gpu}")


def _evidence(event: HealthEvent) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        "kind": event.kind.value,
        "at": from_epoch(event.at).isoformat(),
        "code": event.code,
        "state": event.state,
        "rule": event.rule,
        "detail": event.detail,
    }


def _latest(records: list[UsageRecord]) -> dict[str, LatestReport]:
    latest: dict[str, UsageRecord] = {}
    for r in records:
        if r.gpu_uuid not in latest or r.end > latest[r.gpu_uuid].end:
            latest[r.gpu_uuid] = r
    return {
        gpu: (r.model, str(r.state), r.end, r.device_index, r.minor_number)
        for gpu, r in latest.items()
    }


def held_by_node(session: Session, gpu_uuid: str) -> list[tuple[uuid.UUID, int, int]]:
    """Per node: the records and events held for a GPU in dispute."""
    return repository.held_by_node(session, gpu_uuid)


def lock_node(session: Session, node_id: uuid.UUID) -> None:
    """Wait for the node's batch being stored, and keep its next ones waiting until the
    transaction ends: taken before a GPU's row, in the order ingest takes them."""
    lock_nodes(session, [node_id])


def lock_nodes(session: Session, node_ids: Iterable[uuid.UUID]) -> None:
    """``lock_node`` for several nodes, in one statement and in the order ingest's group
    commit takes them (so the two never wait on each other crosswise)."""
    pipelined(session, [repository.lock_nodes_statement(node_ids)])
