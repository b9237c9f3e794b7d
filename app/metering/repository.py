"""Metering queries. Writes are set-based (one statement per table per batch, over arrays).

Ingest sends its statements in two pipelines (``app.core.db.pipelined``): the ``*_statement``
functions build them, and the plain functions run the same statements one by one (the
simulator). Other packages read metering through ``app.metering.reads``, never here.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    delete,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.orm import Session

from app.core.db import Statement, lock_keys_statement, pipelined
from app.metering import idle, packing
from app.metering.models import HeldItem
from app.metering.segments import Span
from metering_agent.protocol import HealthEvent

# Segments of each (gpu, lo, hi) that overlap or touch [lo, hi]: from the one containing or
# preceding lo (an index probe), so the scan never walks a GPU's whole history.
_SEGMENTS_NEAR = text("""
SELECT q.gpu, s.start, s."end", s.state, s.evidence
FROM unnest(CAST(:gpus AS text[]), CAST(:los AS bigint[]), CAST(:his AS bigint[])) AS q(gpu, lo, hi)
JOIN LATERAL (
    SELECT start, "end", state, evidence FROM gpu_state_segments
    WHERE gpu_uuid = q.gpu AND start <= q.hi AND start >= COALESCE(
        (SELECT max(start) FROM gpu_state_segments WHERE gpu_uuid = q.gpu AND start <= q.lo),
        q.lo)
) AS s ON true
ORDER BY q.gpu, s.start
""")


def lock_nodes_statement(node_ids: Iterable[uuid.UUID]) -> Statement:
    """Serialise each node's batches: each GPU belongs to one node, so its writes don't race
    (``lock_keys``: sorted, so groups locking overlapping nodes never deadlock). Its own
    statement: a statement's snapshot is taken before it waits for the locks, so reads must
    come in later statements to see the batch that held one."""
    return lock_keys_statement(f"ingest:{node_id}" for node_id in node_ids)


def segments_near_statement(windows: dict[str, tuple[int, int]]) -> Statement:
    gpus = list(windows)
    return _SEGMENTS_NEAR, {
        "gpus": gpus,
        "los": [windows[g][0] for g in gpus],
        "his": [windows[g][1] for g in gpus],
    }


def spans_by_gpu(rows: Iterable[Sequence[Any]]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = defaultdict(list)
    for gpu, start, end, state, evidence in rows:
        out[gpu].append(Span(start, end, state, evidence))
    return out


def segments_near(session: Session, windows: dict[str, tuple[int, int]]) -> dict[str, list[Span]]:
    [rows] = pipelined(session, [segments_near_statement(windows)])
    return spans_by_gpu(rows)


_SEGMENT_DELETES = text("""
DELETE FROM gpu_state_segments s
USING unnest(CAST(:u AS text[]), CAST(:s AS bigint[])) AS d(gpu, start)
WHERE s.gpu_uuid = d.gpu AND s.start = d.start
""")


def segment_deletes_statement(deletes: list[tuple[str, int]]) -> Statement | None:
    if not deletes:
        return None
    return _SEGMENT_DELETES, {"u": [g for g, _ in deletes], "s": [s for _, s in deletes]}


_SEGMENT_UPSERTS = text("""
INSERT INTO gpu_state_segments (gpu_uuid, start, "end", state, evidence, received_at)
SELECT u, s, e, st, CAST(ev AS jsonb), now()
FROM unnest(CAST(:u AS text[]), CAST(:s AS bigint[]), CAST(:e AS bigint[]),
            CAST(:st AS text[]), CAST(:ev AS text[])) AS t(u, s, e, st, ev)
ON CONFLICT (gpu_uuid, start) DO UPDATE SET "end" = excluded."end",
    state = excluded.state, received_at = excluded.received_at,
    evidence = COALESCE(gpu_state_segments.evidence, excluded.evidence)
""")


def segment_upserts_statement(upserts: list[tuple[str, Span]]) -> Statement | None:
    if not upserts:
        return None
    return _SEGMENT_UPSERTS, {
        "u": [g for g, _ in upserts],
        "s": [s.start for _, s in upserts],
        "e": [s.end for _, s in upserts],
        "st": [s.state for _, s in upserts],
        "ev": [None if s.evidence is None else json.dumps(s.evidence) for _, s in upserts],
    }


def write_segments(
    session: Session, upserts: list[tuple[str, Span]], deletes: list[tuple[str, int]]
) -> None:
    _run(session, segment_deletes_statement(deletes), segment_upserts_statement(upserts))


def _run(session: Session, *statements: Statement | None) -> None:
    for statement in statements:
        if statement is not None:
            session.execute(*statement)


_ATTACH_EVIDENCE = text("""
UPDATE gpu_state_segments s SET evidence = jsonb_build_object(
    'event_id', e.event_id, 'rule', e.rule, 'code', e.code, 'at', e.at, 'detail', e.detail)
FROM unnest(CAST(:u AS text[]), CAST(:s AS bigint[])) AS k(gpu, start), health_events e
WHERE s.gpu_uuid = k.gpu AND s.start = k.start AND s.evidence IS NULL
  AND e.gpu_uuid = k.gpu AND e.at = k.start AND e.kind = 'state_change'
  AND e.state = s.state
""")


def attach_evidence_statement(keys: list[tuple[str, int]]) -> Statement | None:
    """Give segments starting at these (gpu, second) the state-change event that began them."""
    if not keys:
        return None
    return _ATTACH_EVIDENCE, {"u": [g for g, _ in keys], "s": [s for _, s in keys]}


def attach_evidence(session: Session, keys: list[tuple[str, int]]) -> None:
    _run(session, attach_evidence_statement(keys))


_SENT_EVENTS = """
    SELECT * FROM unnest(CAST(:id AS text[]), CAST(:u AS text[]), CAST(:at AS bigint[]),
        CAST(:k AS text[]), CAST(:c AS int[]), CAST(:st AS text[]), CAST(:r AS text[]),
        CAST(:d AS jsonb[])) WITH ORDINALITY
        AS sent(event_id, gpu_uuid, at, kind, code, state, rule, detail, n)
"""


_EVENT_INSERT = text(f"""
INSERT INTO health_events (event_id, gpu_uuid, at, kind, code, state, rule, detail)
SELECT event_id, gpu_uuid, at, kind, code, state, rule, detail FROM ({_SENT_EVENTS}) s
ORDER BY n
ON CONFLICT (gpu_uuid, event_id, at) DO NOTHING
RETURNING 1
""")
_EVENT_CONFLICTS = text(f"""
SELECT s.n - 1 FROM ({_SENT_EVENTS}) s
JOIN health_events e ON e.gpu_uuid = s.gpu_uuid AND e.event_id = s.event_id
WHERE (s.at, s.kind, s.code, s.state, s.rule, s.detail)
    IS DISTINCT FROM (e.at, e.kind, e.code, e.state, e.rule, e.detail)
ORDER BY s.n
""")


def event_statements(events: Sequence[HealthEvent]) -> tuple[Statement, Statement]:
    """Store events by (GPU, event id), then find conflicts: the statement whose rows count
    the new ones, and the one listing (by index) those whose id the GPU stored before (or the
    batch holds twice) with different content. Run in this order: the second sees the first."""
    params = {
        "id": [e.event_id for e in events],
        "u": [e.gpu_uuid for e in events],
        "at": [e.at for e in events],
        "k": [str(e.kind) for e in events],
        "c": [e.code for e in events],
        "st": [None if e.state is None else str(e.state) for e in events],
        "r": [e.rule for e in events],
        "d": [json.dumps(e.detail) for e in events],
    }
    return (_EVENT_INSERT, params), (_EVENT_CONFLICTS, params)


def insert_events(session: Session, events: Sequence[HealthEvent]) -> tuple[int, list[int]]:
    """Store events: how many were new, and the indexes of the conflicting ones."""
    insert, conflicts = event_statements(events)
    new = len(session.execute(*insert).all())
    return new, [n for (n,) in session.execute(*conflicts)]


@dataclass(frozen=True, slots=True)
class NewestHour:
    """What ingest reads of one GPU's open row for a batch: the hour of the GPU's newest
    records and the span of slots they touch (first slot, count); the span of the previous
    hour's records, if any; and whether the batch holds records of those two hours only."""

    hour: int
    first: int
    n: int
    previous: tuple[int, int] | None
    two_hours_at_most: bool


@dataclass(frozen=True, slots=True)
class OpenSpan:
    """A GPU's open row as ingest reads it for the hour of its newest records: the span of
    slots those records touch. ``rolls``: the row holds an older hour, which this batch closes
    (in SQL, ``open_hours_roll_statement``) as the new hour opens; the span is then empty, and
    ``previous`` the span (first slot, slots) of the closing row that the batch's records of
    the hour before touch, if any."""

    hour: int
    first: int
    slots: bytes
    rolls: bool
    previous: tuple[int, bytes] | None


@dataclass(frozen=True, slots=True)
class StoredMetrics:
    """What a batch's minute metrics land on: its GPUs' open rows and its closed keys. An open
    row of the hour the batch's newest records fall in, or one that hour closes and replaces,
    comes as a span (``spans``); any other comes whole (``open``), to be closed or left as is."""

    open: dict[str, tuple[int, bytes, int | None]]  # gpu -> (hour, slots, mem_total_mib)
    spans: dict[str, OpenSpan]
    closed: dict[tuple[str, int], bytes]  # (gpu, hour) -> slots


# Per GPU: its open row as a span when the row is of the newest records' hour, or when it is of
# an older one that closes as that hour opens (``rolls``: the batch holds records of no hour
# but those two, and those of the hour before only if the row is of that hour); else whole.
# Then the closed rows of the keys older than their GPU's open row (no closed hour is newer):
# looked up key by key (OFFSET 0 keeps the planner from flattening the lookup into a join),
# so none at all in the steady case or at an hour's turn. As a join, the plan read the closed
# table for every batch: at an hour's turn every GPU's row lands in it, while its statistics
# may still say it is empty (a new month, a fresh database), and the plan hashed it all.
_METRIC_ROWS = text("""
SELECT o.gpu_uuid, CASE WHEN o.hour = k.hour OR r.rolls THEN k.hour ELSE o.hour END,
  CASE WHEN o.hour = k.hour THEN substring(o.slots FROM k.first * :s + 1 FOR k.n * :s)
       WHEN r.rolls THEN decode(repeat('00', k.n * :s), 'hex')
       ELSE o.slots END,
  o.mem_total_mib, true, CASE WHEN o.hour = k.hour OR r.rolls THEN k.first END, r.rolls,
  CASE WHEN r.rolls AND o.hour = k.hour - :hour THEN k.pfirst END,
  CASE WHEN r.rolls AND o.hour = k.hour - :hour
       THEN substring(o.slots FROM k.pfirst * :s + 1 FOR k.pn * :s) END
FROM gpu_minute_metrics_open o
JOIN unnest(CAST(:g AS text[]), CAST(:gh AS bigint[]), CAST(:f AS int[]), CAST(:n AS int[]),
            CAST(:pf AS int[]), CAST(:pn AS int[]), CAST(:two AS boolean[]))
  AS k(gpu, hour, first, n, pfirst, pn, two) ON o.gpu_uuid = k.gpu
CROSS JOIN LATERAL (
  SELECT o.hour < k.hour AND k.two AND (k.pn IS NULL OR o.hour = k.hour - :hour) AS rolls
) AS r
UNION ALL
SELECT m.gpu_uuid, m.hour, m.slots, m.mem_total_mib, false, NULL, false, NULL, NULL
FROM unnest(CAST(:u AS text[]), CAST(:h AS bigint[])) AS k(gpu, hour)
LEFT JOIN gpu_minute_metrics_open o ON o.gpu_uuid = k.gpu
CROSS JOIN LATERAL (
  SELECT * FROM gpu_minute_metrics m WHERE m.gpu_uuid = k.gpu AND m.hour = k.hour OFFSET 0
) AS m
WHERE o.hour IS NULL OR k.hour < o.hour
""")


def metric_rows_statement(
    keys: Sequence[tuple[str, int]], newest: dict[str, NewestHour]
) -> Statement:
    """The closed rows of the keys, and the open rows of ``newest``'s GPUs, as spans where
    they can be (``_METRIC_ROWS``); in one statement."""
    gpus = list(newest)
    previous = [newest[g].previous for g in gpus]
    return _METRIC_ROWS, {
        "s": packing.SLOT.size,
        "hour": packing.HOUR,
        "g": gpus,
        "gh": [newest[g].hour for g in gpus],
        "f": [newest[g].first for g in gpus],
        "n": [newest[g].n for g in gpus],
        "pf": _part(previous, 0),
        "pn": _part(previous, 1),
        "two": [newest[g].two_hours_at_most for g in gpus],
        "u": [g for g, _ in keys],
        "h": [h for _, h in keys],
    }


def _part(pairs: Sequence[tuple[Any, Any] | None], i: int) -> list[Any]:
    """Item ``i`` of each optional pair, None where there is none (an array parameter)."""
    return [None if pair is None else pair[i] for pair in pairs]


def stored_metrics(rows: Iterable[Sequence[Any]]) -> StoredMetrics:
    stored = StoredMetrics({}, {}, {})
    for gpu, hour, slots, mem_total, is_open, first, rolls, pfirst, pslots in rows:
        if first is not None:
            previous = None if pfirst is None else (pfirst, bytes(pslots))
            stored.spans[gpu] = OpenSpan(hour, first, bytes(slots), rolls, previous)
        elif is_open:
            stored.open[gpu] = (hour, bytes(slots), mem_total)
        else:
            stored.closed[(gpu, hour)] = packing.loaded(bytes(slots))
    return stored


_OPEN_SPANS_UPDATE = text("""
UPDATE gpu_minute_metrics_open o
SET slots = overlay(o.slots PLACING p.span FROM p.first * :s + 1),
    mem_total_mib = COALESCE(p.mem_total, o.mem_total_mib)
FROM unnest(CAST(:u AS text[]), CAST(:h AS bigint[]), CAST(:f AS int[]), CAST(:d AS bytea[]),
            CAST(:t AS int[])) AS p(gpu, hour, first, span, mem_total)
WHERE o.gpu_uuid = p.gpu AND o.hour = p.hour
""")


def open_spans_write_statement(
    spans: dict[str, tuple[int, int, bytes, int | None]],
) -> Statement | None:
    """Overwrite a span of slots of GPUs' open rows in place (gpu -> hour, first slot, the
    span's new slots, mem_total_mib or None to keep it): the rest of each row is not sent."""
    if not spans:
        return None
    gpus = list(spans)
    return _OPEN_SPANS_UPDATE, {
        "s": packing.SLOT.size,
        "u": gpus,
        "h": [spans[g][0] for g in gpus],
        "f": [spans[g][1] for g in gpus],
        "d": [spans[g][2] for g in gpus],
        "t": [spans[g][3] for g in gpus],
    }


# The GPUs' open rows of an older hour close, as they are (their idle floor left to
# ``summarise_closed_hours``) or with the closing hour's new records overlaid; the newest
# hour opens in their place, its span overlaid on an empty row.
_OPEN_HOURS_ROLL = text("""
WITH p AS (
  SELECT * FROM unnest(CAST(:u AS text[]), CAST(:h AS bigint[]), CAST(:f AS int[]),
                       CAST(:d AS bytea[]), CAST(:t AS int[]), CAST(:pf AS int[]),
                       CAST(:pd AS bytea[]), CAST(:pt AS int[]))
    AS p(gpu, hour, first, span, mem_total, pfirst, pspan, pmem)
), closing AS (
  INSERT INTO gpu_minute_metrics (gpu_uuid, hour, mem_total_mib, slots, util_min_tenths)
  SELECT o.gpu_uuid, o.hour, COALESCE(p.pmem, o.mem_total_mib),
         COALESCE(overlay(o.slots PLACING p.pspan FROM p.pfirst * :s + 1), o.slots), :pending
  FROM gpu_minute_metrics_open o JOIN p ON o.gpu_uuid = p.gpu AND o.hour < p.hour
  ON CONFLICT (gpu_uuid, hour) DO UPDATE SET slots = excluded.slots,
      mem_total_mib = COALESCE(excluded.mem_total_mib, gpu_minute_metrics.mem_total_mib),
      util_min_tenths = excluded.util_min_tenths
)
UPDATE gpu_minute_metrics_open o
SET hour = p.hour, slots = overlay(:empty PLACING p.span FROM p.first * :s + 1),
    mem_total_mib = p.mem_total
FROM p WHERE o.gpu_uuid = p.gpu AND o.hour < p.hour
""")


@dataclass(frozen=True, slots=True)
class Roll:
    """A GPU's open row closing as its newest hour opens: that hour's span (first slot,
    slots) and memory total; the closing row's span of new records and memory total, if any."""

    hour: int
    first: int
    slots: bytes
    mem_total: int | None
    previous: tuple[int, bytes] | None
    previous_mem_total: int | None


def open_hours_roll_statement(rolls: dict[str, Roll]) -> Statement | None:
    """Close GPUs' open rows of an older hour and open their newest (gpu -> ``Roll``): the
    closing rows are copied in SQL, not read and rewritten (at an hour's turn every GPU's row
    closes in the same upload round)."""
    if not rolls:
        return None
    gpus = list(rolls)
    previous = [rolls[g].previous for g in gpus]
    return _OPEN_HOURS_ROLL, {
        "s": packing.SLOT.size,
        "pending": idle.UNSUMMARISED,
        "empty": packing.EMPTY_ROW,
        "u": gpus,
        "h": [rolls[g].hour for g in gpus],
        "f": [rolls[g].first for g in gpus],
        "d": [rolls[g].slots for g in gpus],
        "t": [rolls[g].mem_total for g in gpus],
        "pf": _part(previous, 0),
        "pd": _part(previous, 1),
        "pt": [rolls[g].previous_mem_total for g in gpus],
    }


_CLOSED_HOURS_UPSERT = text("""
INSERT INTO gpu_minute_metrics (gpu_uuid, hour, mem_total_mib, slots, util_min_tenths)
SELECT * FROM unnest(CAST(:u AS text[]), CAST(:h AS bigint[]), CAST(:t AS int[]),
                     CAST(:d AS bytea[]), CAST(:m AS smallint[]))
ON CONFLICT (gpu_uuid, hour) DO UPDATE SET slots = excluded.slots,
    mem_total_mib = COALESCE(excluded.mem_total_mib, gpu_minute_metrics.mem_total_mib),
    util_min_tenths = excluded.util_min_tenths
""")
_OPEN_HOURS_UPSERT = text("""
INSERT INTO gpu_minute_metrics_open (gpu_uuid, hour, mem_total_mib, slots)
SELECT * FROM unnest(CAST(:u AS text[]), CAST(:h AS bigint[]), CAST(:t AS int[]),
                     CAST(:d AS bytea[]))
ON CONFLICT (gpu_uuid) DO UPDATE SET hour = excluded.hour, slots = excluded.slots,
    mem_total_mib = excluded.mem_total_mib
""")


def metric_rows_write_statement(
    rows: dict[tuple[str, int], tuple[bytes, int | None]], *, closed: bool
) -> Statement | None:
    """Upsert hour rows into the closed table, or GPUs' open rows (at most one key per GPU;
    it replaces the GPU's open hour, which the caller has moved to the closed table)."""
    if not rows:
        return None
    keys = list(rows)
    params = {
        "u": [g for g, _ in keys],
        "h": [h for _, h in keys],
        "t": [rows[k][1] for k in keys],
        "d": [packing.stored(rows[k][0]) if closed else rows[k][0] for k in keys],
    }
    if closed:
        params["m"] = [idle.util_floor_tenths(rows[k][0]) for k in keys]
    return (_CLOSED_HOURS_UPSERT if closed else _OPEN_HOURS_UPSERT), params


_UNSUMMARISED = text("""
SELECT gpu_uuid, hour, slots FROM gpu_minute_metrics WHERE util_min_tenths = :pending
ORDER BY hour LIMIT :n FOR UPDATE SKIP LOCKED
""")
_SUMMARIES = text("""
UPDATE gpu_minute_metrics m SET slots = p.slots, util_min_tenths = p.floor
FROM unnest(CAST(:u AS text[]), CAST(:h AS bigint[]), CAST(:d AS bytea[]),
            CAST(:m AS smallint[])) AS p(gpu, hour, slots, floor)
WHERE m.gpu_uuid = p.gpu AND m.hour = p.hour
""")


def unsummarised_hours(session: Session, limit: int) -> list[tuple[str, int, bytes]]:
    """Up to ``limit`` closed hours not yet summarised, oldest first, locked (others being
    written now are skipped: their writer summarises them)."""
    [rows] = pipelined(session, [(_UNSUMMARISED, {"pending": idle.UNSUMMARISED, "n": limit})])
    return [(gpu, hour, bytes(slots)) for gpu, hour, slots in rows]


def summarise_hours(session: Session, raw: list[tuple[str, int, bytes]]) -> None:
    """Store closed hours deflated, with their idle floor."""
    _run(
        session,
        (
            _SUMMARIES,
            {
                "u": [gpu for gpu, _, _ in raw],
                "h": [hour for _, hour, _ in raw],
                "d": [packing.stored(slots) for _, _, slots in raw],
                "m": [idle.util_floor_tenths(slots) for _, _, slots in raw],
            },
        ),
    )


def write_metric_rows(
    session: Session, rows: dict[tuple[str, int], tuple[bytes, int | None]], *, closed: bool
) -> None:
    _run(session, metric_rows_write_statement(rows, closed=closed))


# --- reads behind app.metering.reads (the console's timelines, fleet health) ----------


def events_of(
    session: Session, gpu_uuids: Sequence[str], start: int, end: int
) -> dict[str, list[dict[str, Any]]]:
    """Each GPU's health events in ``[start, end)`` in one query (the rental page's bands)."""
    rows = session.execute(
        text("""
        SELECT gpu_uuid, event_id, at, kind, code, state, rule, detail FROM health_events
        WHERE gpu_uuid = ANY(:u) AND at >= :start AND at < :end ORDER BY at, event_id
        """),
        {"u": list(gpu_uuids), "start": start, "end": end},
    )
    out: dict[str, list[dict[str, Any]]] = {gpu: [] for gpu in gpu_uuids}
    for row in rows:
        event = dict(row._mapping)
        out[event.pop("gpu_uuid")].append(event)
    return out


def failed_since(session: Session, since: int) -> list[dict[str, Any]]:
    """Failed segments that began at or after ``since``, newest first (at most 1000)."""
    rows = session.execute(
        text("""
        SELECT s.gpu_uuid, s.start, s."end", s.evidence
        FROM gpu_state_segments s
        WHERE s.state = 'failed' AND s.start >= :since
        ORDER BY s.start DESC, s.gpu_uuid LIMIT 1000
        """),
        {"since": since},
    )
    return [dict(row._mapping) for row in rows]


# --- held telemetry (a GPU in dispute) ------------------------------------------------------


def held_counts(session: Session, gpu_uuids: Iterable[str]) -> dict[str, int]:
    """How many items are held for each of these GPUs (none: left out)."""
    rows = session.execute(
        select(HeldItem.gpu_uuid, func.count())
        .where(HeldItem.gpu_uuid.in_(list(gpu_uuids)))
        .group_by(HeldItem.gpu_uuid)
    )
    return {gpu: count for gpu, count in rows}


def hold(session: Session, node_id: uuid.UUID, items: list[tuple[str, str, Any]]) -> None:
    """Hold the node's (GPU, kind, item as JSON) items."""
    session.execute(
        insert(HeldItem),
        [{"gpu_uuid": g, "node_id": node_id, "kind": k, "item": i} for g, k, i in items],
    )


def held_by_node(session: Session, gpu_uuid: str) -> list[tuple[uuid.UUID, int, int]]:
    """Per node: the records and events held for the GPU."""
    records = func.count().filter(HeldItem.kind == "record")
    rows = session.execute(
        select(HeldItem.node_id, records, func.count() - records)
        .where(HeldItem.gpu_uuid == gpu_uuid)
        .group_by(HeldItem.node_id)
        .order_by(HeldItem.node_id)
    )
    return [(node, r, e) for node, r, e in rows]


def take_held(session: Session, gpu_uuid: str) -> list[tuple[uuid.UUID, str, Any]]:
    """Remove the GPU's held items; each (node, kind, item), in the order they came."""
    rows = session.execute(
        delete(HeldItem)
        .where(HeldItem.gpu_uuid == gpu_uuid)
        .returning(HeldItem.id, HeldItem.node_id, HeldItem.kind, HeldItem.item)
    )
    return [(node, kind, item) for _, node, kind, item in sorted(rows)]
