"""Durable on-disk spool: nothing closed is uploaded before it is fsync'd here.

Layout of the spool directory:

- ``journal.jsonl``: the open segment: closed records and events, one JSON object per line
  (``{"record": {...}}`` or ``{"event": {...}}``), appended and fsync'd once per second by the
  sampling loop (``flush``);
- ``batches/<seq>-<batch_id>.jsonl``: sealed segments, oldest first. Sealing *renames* the
  journal, so it needs no free space; the batch id is fixed then, so retries and restarts resend
  the same id. The uploader builds the ``IngestBatch`` JSON from the lines (``read_batch``).
  Batches of earlier versions (``<seq>-<batch_id>.json``, an ``IngestBatch``) are still read;
- ``dead-letter/``: batches the service rejected with a 4xx, and the items it refused from a
  batch it stored (``<batch>.refused.json``: each item with the service's answer), kept for an
  operator;
- ``quarantine/``: files found unreadable at start (a torn or garbage line, an item that is not a
  record or event, a garbage ``state.json``, a stray file), moved aside whole so the agent starts;
  the readable items in them are spooled again. Logged (``spool_quarantined``) and counted
  (``gpumeter_agent_spool_quarantined_total``);
- ``state.json``: the end of the last spooled record per GPU, so a restarted agent never starts a
  record before it (the records themselves may already be uploaded and deleted).

When nothing more can be written (journal plus batches at ``max_bytes``, or the file system full
or failing), new items are held in memory up to ``max_held_bytes``: ``spool_full`` is logged with
its reason and ``gpumeter_agent_spool_full`` is 1; nothing spooled is touched, and held items are
written as soon as there is room again. An item beyond the memory bound is dropped, counted, and
once the spool takes writes again each GPU's dropped seconds are reported as one ``unmetered``
event (reason ``spool_full``), so the gap is explained, not silent. Items still held when the
agent stops are logged as lost. Dead letters and quarantine do not count against ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from metering_agent.logs import Log
from metering_agent.metrics import Metrics
from metering_agent.protocol import (
    MINUTE,
    PROTOCOL_VERSION,
    EventKind,
    GpuState,
    HealthEvent,
    UsageRecord,
)
from metering_agent.records import unmetered_event

DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_HELD_BYTES = 64 << 20
BATCH_NAME = re.compile(r"^(\d+)-([\w-]+)\.(jsonl|json)$")
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
log = Log("metering_agent.spool")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all; no temporary file is left behind on failure."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


@dataclass(frozen=True, slots=True)
class _Item:
    """A closed record or event as its journal line, with what loss accounting needs."""

    line: bytes
    gpu_uuid: str
    start: int
    end: int
    is_record: bool

    @classmethod
    def of(cls, entry: dict[str, Any]) -> _Item:
        line = (json.dumps(entry) + "\n").encode()
        if "record" in entry:
            r = entry["record"]
            return cls(line, r["gpu_uuid"], r["start"], r["end"], True)
        e = entry["event"]
        return cls(line, e["gpu_uuid"], e["at"], e["at"], False)


@dataclass(slots=True)
class _Loss:
    """What one GPU lost to the memory bound during one spool-full episode."""

    start: int
    end: int
    seconds: int = 0
    records: int = 0
    events: int = 0


def _is_int(value: Any) -> bool:
    return type(value) is int  # JSON true/false are not seconds


def _readable_record(r: Any) -> bool:
    try:
        UsageRecord(**r)
        GpuState(r["state"])
    except (TypeError, ValueError):
        return False
    return (
        isinstance(r["gpu_uuid"], str)
        and isinstance(r["model"], str)
        and all(_is_int(r[k]) for k in ("start", "end", "sample_count"))
        and r["start"] < r["end"]
    )


def _readable_event(e: Any) -> bool:
    try:
        HealthEvent(**e)
        EventKind(e["kind"])
    except (TypeError, ValueError):
        return False
    return isinstance(e["event_id"], str) and isinstance(e["gpu_uuid"], str) and _is_int(e["at"])


def _readable(entry: Any) -> bool:
    if not isinstance(entry, dict) or len(entry) != 1:
        return False
    if "record" in entry:
        return _readable_record(entry["record"])
    return "event" in entry and _readable_event(entry["event"])


def _json_or_none(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def parse_entries(path: Path, data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The readable entries of a journal or batch file, and how many pieces were unreadable."""
    if path.suffix == ".json":  # an IngestBatch written by an earlier agent version
        try:
            batch = json.loads(data)
            items = [{"record": r} for r in batch["records"]] + [
                {"event": e} for e in batch["events"]
            ]
        except (ValueError, TypeError, KeyError):
            return [], 1
    else:
        items = [_json_or_none(line) for line in data.splitlines()]
    readable = [entry for entry in items if _readable(entry)]
    return readable, len(items) - len(readable)


def read_batch(path: Path) -> dict[str, Any]:
    """A sealed batch as ``IngestBatch`` JSON; its id is the one fixed at sealing."""
    match = BATCH_NAME.match(path.name)
    assert match is not None, path
    entries, _ = parse_entries(path, path.read_bytes())
    return {
        "batch_id": match.group(2),
        "records": [e["record"] for e in entries if "record" in e],
        "events": [e["event"] for e in entries if "event" in e],
        "protocol_version": PROTOCOL_VERSION,
    }


# Readings a record may leave out: two records join only if each leaves out the same ones.
_OPTIONAL = (
    "gpu_util_mean", "gpu_util_max", "mem_util_mean", "mem_used_max_mib", "mem_total_mib",
    "energy_j", "power_max_w", "temp_max_c", "sm_clock_mean_mhz",
)  # fmt: skip
_MAXIMA = ("gpu_util_max", "mem_used_max_mib", "power_max_w", "temp_max_c")
_MEANS = ("gpu_util_mean", "mem_util_mean")


def coalesce(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with each run of one GPU's adjacent records of one minute, state and
    device as one record (in the order each run began): the sampling loop spools one-second
    records, the service is sent runs. What the service stores is the same either way
    (protocol.py: the records of a minute combine exactly): counts and energies add up (energy
    in the decijoules records carry), maxima are the larger, and each mean is the sum it
    stands for (mean x samples, exact to the unit for a minute's samples) over the samples.
    The SM clock mean (whole MHz, not stored by the service) is the mean of the records'."""
    out: list[dict[str, Any]] = []
    clock_sums: dict[int, int] = {}  # index in out -> its records' SM clock x samples
    last: dict[str, int] = {}  # GPU -> index in out of its latest record
    for r in records:
        at = last.get(r["gpu_uuid"])
        if at is not None and _joins(out[at], r):
            out[at] = _joined(out[at], r)
        else:
            at = last[r["gpu_uuid"]] = len(out)
            out.append(r)
        if r.get("sm_clock_mean_mhz") is not None:
            clock_sums[at] = clock_sums.get(at, 0) + r["sm_clock_mean_mhz"] * r["sample_count"]
    for at, clock_sum in clock_sums.items():
        if out[at]["sample_count"]:
            out[at]["sm_clock_mean_mhz"] = clock_sum // out[at]["sample_count"]
    return out


def _joins(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        b["start"] == a["end"]
        and b["start"] // MINUTE == a["start"] // MINUTE
        and (b["state"], b["model"], b.get("device_index"))
        == (a["state"], a["model"], a.get("device_index"))
        and all((a.get(k) is None) == (b.get(k) is None) for k in _OPTIONAL)
    )


def _joined(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    na, nb = a["sample_count"], b["sample_count"]
    n = na + nb
    joined = {**a, "end": b["end"], "sample_count": n}
    for k in _MAXIMA:
        if a.get(k) is not None:
            joined[k] = max(a[k], b[k])
    for k in _MEANS:
        if a.get(k) is not None and n:
            joined[k] = round((round(a[k] * na) + round(b[k] * nb)) / n, 2)
    if a.get("energy_j") is not None:
        joined["energy_j"] = (round(a["energy_j"] * 10) + round(b["energy_j"] * 10)) / 10
    return joined  # the first memory total, as the service keeps a row's first


class Spool:
    def __init__(
        self,
        root: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
        batch_max_items: int = 500,
        seal_after_s: float = 5.0,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = Path(root)
        self.batch_dir = self.root / "batches"
        self.dead_dir = self.root / "dead-letter"
        self.quarantine_dir = self.root / "quarantine"
        for d in (self.root, self.batch_dir, self.dead_dir, self.quarantine_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.max_held_bytes = max_bytes, max_held_bytes
        self.batch_max_items, self.seal_after_s = batch_max_items, seal_after_s
        self._metrics = metrics or Metrics()
        self._clock = clock
        self._lock = threading.RLock()
        self._held: deque[_Item] = deque()  # closed items not yet in the journal
        self._held_bytes = 0
        self._lost: dict[str, _Loss] = {}  # per GPU, dropped beyond the memory bound
        # Once dropping, drop everything until the held items are written, so each GPU's
        # loss is one contiguous span of seconds.
        self._dropping = False
        self._fd: int | None = None  # the journal, opened on the first write
        self._journal_path = self.root / "journal.jsonl"
        self._journal_items = 0
        self._journal_bytes = 0
        self._journal_since: float | None = None  # when the oldest journal entry was written
        self._state_path = self.root / "state.json"
        self._state_dirty = False
        self.full = False
        self.full_reason: str | None = None
        self._batch_sizes: dict[Path, int] = {}
        self._seq = 0
        self.last_ends: dict[str, int] = self._load_state()
        self._recover()
        self._publish()

    # -- start-up ---------------------------------------------------------------------------

    def _load_state(self) -> dict[str, int]:
        try:
            state = json.loads(self._state_path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            state = None
        ends = {}
        if isinstance(state, dict):
            ends = {k: v for k, v in state.items() if isinstance(k, str) and _is_int(v)}
        if not isinstance(state, dict) or len(ends) != len(state):
            # Ends are rebuilt from the batches and journal; only uploaded ones are forgotten.
            self._quarantine(self._state_path, "not a JSON object of GPU uuid -> end second")
            self._state_dirty = True
        return ends

    def _recover(self) -> None:
        """Adopt what a previous run left: seal its journal, check every batch, drop temp files."""
        for tmp in itertools.chain(self.root.glob(".*.tmp"), self.batch_dir.glob(".*.tmp")):
            tmp.unlink(missing_ok=True)
            log.warning("spool_temp_removed", file=str(tmp.relative_to(self.root)))
        batches = sorted(self.batch_dir.iterdir())
        known = [p for p in batches if BATCH_NAME.match(p.name) and p.is_file()]
        for stray in sorted(set(batches) - set(known)):
            self._quarantine(stray, "not a spool batch")
        self._seq = max((int(p.name.split("-", 1)[0]) for p in known), default=0)
        respooled = [path for path in known if not self._adopt(path)]
        if self._journal_path.exists() and self._adopt(self._journal_path):
            self._journal_bytes = self._journal_path.stat().st_size
            self._rotate()
        # Items taken out of damaged or old-format files are journalled again, as a batch of
        # their own; an old-format file goes only once its items are durable here.
        self.flush()
        self.seal(force=True)
        for path in respooled:
            if path.exists() and not self._held:
                path.unlink()
        log.info("spool_recovered", batches=len(self._batch_sizes), held=len(self._held))

    def _adopt(self, path: Path) -> bool:
        """Check a file a previous run left; True when it can stay as it is (a whole batch or
        journal). Otherwise it is quarantined when unreadable, and its readable items are held
        to be spooled again."""
        try:
            entries, unreadable = parse_entries(path, path.read_bytes())
        except OSError as e:
            entries, unreadable = [], 1
            log.error("spool_file_unreadable", file=path.name, error=repr(e))
        for entry in entries:
            if "record" in entry:
                self._note_end(entry["record"])
        if not unreadable and path.suffix == ".jsonl" and entries:
            if path.parent == self.batch_dir:
                self._batch_sizes[path] = path.stat().st_size
            return True
        if unreadable:
            self._quarantine(path, f"{unreadable} unreadable item(s)", kept=len(entries))
        for entry in entries:
            self._hold(_Item.of(entry))
        return False

    def _quarantine(self, path: Path, reason: str, kept: int = 0) -> None:
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        target = self.quarantine_dir / f"{stamp}-{path.name}"
        os.replace(path, target)  # a rename: works on a full disk too
        self._metrics.inc("gpumeter_agent_spool_quarantined_total")
        log.error(
            "spool_quarantined", file=path.name, reason=reason, moved_to=str(target), kept=kept
        )

    def _note_end(self, record: dict[str, Any]) -> None:
        gpu = record["gpu_uuid"]
        if record["end"] > self.last_ends.get(gpu, 0):
            self.last_ends[gpu] = record["end"]
            self._state_dirty = True

    # -- the sampling loop's side -----------------------------------------------------------

    def append(self, records: Iterable[UsageRecord], events: Iterable[HealthEvent]) -> None:
        """Queue items; they are durable once ``flush`` returns with ``held() == 0``."""
        entries = [{"record": asdict(r)} for r in records] + [{"event": asdict(e)} for e in events]
        with self._lock:
            for entry in entries:
                item = _Item.of(entry)
                if not self._dropping and self._held_bytes + len(item.line) > self.max_held_bytes:
                    self._dropping = True
                    log.error(
                        "spool_dropping",
                        held_bytes=self._held_bytes,
                        max_held_bytes=self.max_held_bytes,
                        action="new items dropped until the spool takes writes; then reported",
                    )
                if self._dropping:
                    self._drop(item)
                else:
                    self._hold(item)

    def _hold(self, item: _Item) -> None:
        self._held.append(item)
        self._held_bytes += len(item.line)

    def _drop(self, item: _Item) -> None:
        loss = self._lost.setdefault(item.gpu_uuid, _Loss(item.start, item.end))
        if item.is_record:
            # The span is the dropped records' seconds: a dropped event's second may have been
            # kept (a cut spools a second's record before the event it brought).
            if not loss.records:
                loss.start, loss.end = item.start, item.end
            loss.start, loss.end = min(loss.start, item.start), max(loss.end, item.end)
            loss.records += 1
            loss.seconds += item.end - item.start
            self._metrics.inc("gpumeter_agent_spool_dropped_seconds_total", item.end - item.start)
        else:
            loss.events += 1
        self._metrics.inc("gpumeter_agent_spool_dropped_items_total")

    def flush(self) -> None:
        """Write held items to the journal (fsync'd) as far as the limit and the disk allow."""
        with self._lock:
            self.full_reason = None
            while self._held and self._write_some():
                pass
            if self._lost and not self._held:
                self._report_losses()
                while self._held and self._write_some():
                    pass
            self._save_state()
            self._set_full(bool(self._held))
            self._publish()

    def _write_some(self) -> bool:
        """Append the oldest held items that fit; False when no more can be written now."""
        if self._journal_items >= self.batch_max_items and not self._rotate():
            return False
        room = self.max_bytes - self.bytes()
        take: list[_Item] = []
        for item in itertools.islice(self._held, self.batch_max_items - self._journal_items):
            room -= len(item.line)
            if room < 0:
                break
            take.append(item)
        if not take:
            self.full_reason = "size_limit"
            return False
        written = self._append_journal(take)
        for item in take[:written]:
            self._held.popleft()
            self._held_bytes -= len(item.line)
            if item.is_record:
                self._note_end({"gpu_uuid": item.gpu_uuid, "end": item.end})
        return written == len(take)

    def _append_journal(self, items: list[_Item]) -> int:
        """Append items and fsync; return how many are durable. A torn tail is cut off, so the
        journal always ends with a whole line."""
        data = b"".join(item.line for item in items)
        try:
            fd = self._journal_fd()
            written = os.write(fd, data)  # short when the disk fills up
            ends = list(itertools.accumulate(len(item.line) for item in items))
            kept = sum(1 for end in ends if end <= written)
            size = ends[kept - 1] if kept else 0
            if size < written:
                os.ftruncate(fd, self._journal_bytes + size)
            os.fsync(fd)
        except OSError as e:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._journal_bytes)
            self._write_failed(e)
            return 0
        if kept < len(items):
            self._write_failed(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        if kept:
            self._journal_bytes += size
            self._journal_items += kept
            self._journal_since = self._journal_since or self._clock()
        return kept

    def _journal_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            _fsync_dir(self.root)
        return self._fd

    def _write_failed(self, e: OSError) -> None:
        self.full_reason = "disk_full" if e.errno in NO_SPACE else f"write_error: {e.strerror}"

    def _report_losses(self) -> None:
        """The spool takes writes again: report what the memory bound made us drop."""
        lost, self._lost, self._dropping = self._lost, {}, False
        for gpu, loss in lost.items():
            event = unmetered_event(
                gpu,
                loss.start,
                loss.end,
                "spool_full",
                seconds=loss.seconds,
                records_lost=loss.records,
                events_lost=loss.events,
            )
            log.error("spool_items_dropped", gpu_uuid=gpu, **event.detail)
            self._hold(_Item.of({"event": asdict(event)}))

    def _set_full(self, full: bool) -> None:
        if full and not self.full:
            log.error(
                "spool_full",
                reason=self.full_reason,
                bytes=self.bytes(),
                max_bytes=self.max_bytes,
                held_items=len(self._held),
                max_held_bytes=self.max_held_bytes,
                action="holding new items in memory until the spool has room",
            )
        elif self.full and not full:
            log.info("spool_space_available", bytes=self.bytes())
        self.full = full

    def _save_state(self) -> None:
        if not self._state_dirty:
            return
        try:
            write_atomic(self._state_path, json.dumps(self.last_ends).encode())
        except OSError as e:  # retried next second; the batches still hold these ends
            self._write_failed(e)
            return
        self._state_dirty = False

    def seal(self, *, force: bool = False) -> None:
        """Turn the journal into an upload batch when it is big or old enough (or ``force``)."""
        with self._lock:
            if not self._journal_items:
                return
            old = (self._clock() - (self._journal_since or 0)) >= self.seal_after_s
            if force or old or self._journal_items >= self.batch_max_items:
                self._rotate()
                self._publish()

    def _next_batch_path(self) -> Path:
        return self.batch_dir / f"{self._seq + 1:010d}-{uuid.uuid4()}.jsonl"

    def _rotate(self) -> bool:
        """Seal the journal as the next batch by renaming it: needs no free space."""
        path = self._next_batch_path()
        try:
            os.replace(self._journal_path, path)
        except OSError as e:
            self._write_failed(e)
            return False
        self._seq += 1
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with contextlib.suppress(OSError):  # the rename itself is done; this makes it durable
            _fsync_dir(self.batch_dir)
            _fsync_dir(self.root)
        self._batch_sizes[path] = self._journal_bytes
        self._journal_items = self._journal_bytes = 0
        self._journal_since = None
        return True

    # -- the uploader's side ----------------------------------------------------------------

    def batches(self) -> list[Path]:
        with self._lock:
            return sorted(self._batch_sizes)

    def remove(self, path: Path) -> None:
        with self._lock:
            path.unlink(missing_ok=True)
            self._batch_sizes.pop(path, None)
            self._publish()

    def dead_letter(self, path: Path) -> Path:
        with self._lock:
            target = self.dead_dir / path.name
            os.replace(path, target)
            _fsync_dir(self.dead_dir)
            self._batch_sizes.pop(path, None)
            self._publish()
            return target

    def dead_letter_items(self, path: Path, items: list[dict[str, Any]]) -> Path:
        """Keep items the service refused from the batch ``path`` (which it stored)."""
        target = self.dead_dir / f"{path.stem}.refused.json"
        write_atomic(target, json.dumps({"batch": path.name, "items": items}).encode())
        return target

    # -- accounting -------------------------------------------------------------------------

    def bytes(self) -> int:
        return self._journal_bytes + sum(self._batch_sizes.values())

    def held(self) -> int:
        return len(self._held)

    def _publish(self) -> None:
        m = self._metrics
        m.set("gpumeter_agent_spool_bytes", self.bytes())
        m.set("gpumeter_agent_spool_batches", len(self._batch_sizes))
        m.set("gpumeter_agent_spool_journal_items", self._journal_items)
        m.set("gpumeter_agent_spool_held_items", len(self._held))
        m.set("gpumeter_agent_spool_held_bytes", self._held_bytes)
        m.set("gpumeter_agent_spool_full", int(self.full))

    def close(self) -> None:
        with self._lock:
            if self._held or self._lost:
                log.error(
                    "spool_items_lost_at_exit",
                    held_items=len(self._held),
                    dropped={gpu: asdict(loss) for gpu, loss in self._lost.items()},
                    reason=self.full_reason,
                )
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
