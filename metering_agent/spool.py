"""Durable on-disk spool: nothing closed is uploaded before it is fsync'd here.

Layout of the spool directory:

- ``journal.jsonl``: closed records and events, one JSON object per line, appended and fsync'd
  once per second (``flush``) by the sampling loop;
- ``batches/<seq>-<batch_id>.json``: sealed upload batches (``protocol.IngestBatch`` as JSON),
  written atomically; the batch id is fixed at sealing, so retries and restarts resend the same id;
- ``dead-letter/``: batches the service rejected with a 4xx, kept for an operator;
- ``state.json``: the end of the last spooled record per GPU, so a restarted agent never starts a
  record before it (the records themselves may already be uploaded and deleted).

Size limit: journal plus batches may not exceed ``max_bytes``. On reaching it the spool stops
appending and holds new items in memory (``held``), logs ``spool_full`` as an error and sets the
``gpumeter_agent_spool_full`` metric; nothing already spooled is dropped, and held items are
written as soon as uploads make room. Held items are lost if the agent is killed while full.
Dead letters do not count against the limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from metering_agent.logs import Log
from metering_agent.metrics import Metrics
from metering_agent.protocol import PROTOCOL_VERSION, HealthEvent, UsageRecord

DEFAULT_MAX_BYTES = 1 << 30
log = Log("metering_agent.spool")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class Spool:
    def __init__(
        self,
        root: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        batch_max_items: int = 500,
        seal_after_s: float = 5.0,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = Path(root)
        self.batch_dir = self.root / "batches"
        self.dead_dir = self.root / "dead-letter"
        for d in (self.root, self.batch_dir, self.dead_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.batch_max_items, self.seal_after_s = (
            max_bytes,
            batch_max_items,
            seal_after_s,
        )
        self._metrics = metrics or Metrics()
        self._clock = clock
        self._lock = threading.RLock()
        self._held: deque[tuple[str, dict[str, Any]]] = deque()  # (line, entry) not journalled
        self._journal: list[dict[str, Any]] = []  # entries in journal.jsonl
        self._journal_since: float | None = None  # when the oldest journal entry was written
        self._journal_path = self.root / "journal.jsonl"
        self._state_path = self.root / "state.json"
        self.full = False
        self._batch_sizes = {p: p.stat().st_size for p in self.batch_dir.glob("*.json")}
        self._journal_bytes = 0
        self.last_ends: dict[str, int] = self._load_state()
        self._state_dirty = False
        self._seq = max((self._seq_of(p) for p in self.batches()), default=0)
        self._recover_journal()
        self._fd = os.open(self._journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._publish()

    # -- start-up ---------------------------------------------------------------------------

    def _load_state(self) -> dict[str, int]:
        ends: dict[str, int] = {}
        with contextlib.suppress(FileNotFoundError):
            ends.update(json.loads(self._state_path.read_text()))
        for path in self.batches():
            try:
                records = json.loads(path.read_bytes()).get("records", [])
            except ValueError:
                log.error("spool_batch_unreadable", batch=path.name)  # the service will 4xx it
                continue
            for record in records:
                self._note_end(ends, record)
        return ends

    @staticmethod
    def _note_end(ends: dict[str, int], record: dict[str, Any]) -> None:
        ends[record["gpu_uuid"]] = max(ends.get(record["gpu_uuid"], 0), record["end"])

    def _recover_journal(self) -> None:
        """Seal what a previous run left in the journal, dropping a torn last line."""
        if not self._journal_path.exists():
            return
        for n, line in enumerate(self._journal_path.read_bytes().splitlines()):
            try:
                entry = json.loads(line)
            except ValueError:
                log.warning("spool_torn_line_dropped", line_no=n, bytes=len(line))
                continue
            self._journal.append(entry)
            if "record" in entry:
                self._note_end(self.last_ends, entry["record"])
        log.info("spool_recovered", journal_items=len(self._journal), batches=len(self.batches()))
        self._seal_entries()
        self._journal_path.unlink()
        self._write_state()

    # -- the sampling loop's side -----------------------------------------------------------

    def append(self, records: Iterable[UsageRecord], events: Iterable[HealthEvent]) -> None:
        """Queue items; they are durable once ``flush`` returns."""
        entries = [{"record": asdict(r)} for r in records] + [{"event": asdict(e)} for e in events]
        with self._lock:
            self._held.extend((json.dumps(entry) + "\n", entry) for entry in entries)

    def flush(self) -> None:
        """Write queued items that fit under the size limit to the journal and fsync it."""
        with self._lock:
            lines: list[str] = []
            room = self.max_bytes - self.bytes()
            for line, _ in self._held:
                room -= len(line)
                if room < 0:
                    break
                lines.append(line)
            if lines:
                # Written before leaving ``held``: a failed write (disk full) loses nothing.
                data = "".join(lines).encode()
                os.write(self._fd, data)
                os.fsync(self._fd)
                self._journal_bytes += len(data)
                self._journal_since = self._journal_since or self._clock()
                for _ in lines:
                    self._add_entry(self._held.popleft()[1])
            if self._state_dirty:
                self._write_state()
            self._set_full(bool(self._held))
            self._publish()

    def _add_entry(self, entry: dict[str, Any]) -> None:
        self._journal.append(entry)
        if "record" in entry:
            self._note_end(self.last_ends, entry["record"])
            self._state_dirty = True

    def _set_full(self, full: bool) -> None:
        if full and not self.full:
            log.error(
                "spool_full",
                bytes=self.bytes(),
                max_bytes=self.max_bytes,
                held_items=len(self._held),
                action="holding new items in memory until uploads make room",
            )
        elif self.full and not full:
            log.info("spool_space_available", bytes=self.bytes())
        self.full = full

    def _write_state(self) -> None:
        write_atomic(self._state_path, json.dumps(self.last_ends).encode())
        self._state_dirty = False

    def seal(self, *, force: bool = False) -> None:
        """Turn the journal into upload batches when it is big or old enough (or ``force``)."""
        with self._lock:
            if not self._journal:
                return
            old = (self._clock() - (self._journal_since or 0)) >= self.seal_after_s
            if force or old or len(self._journal) >= self.batch_max_items:
                self._seal_entries()
                os.ftruncate(self._fd, 0)
                os.fsync(self._fd)
                self._journal_bytes = 0
                self._journal_since = None
                self._publish()

    def _seal_entries(self) -> None:
        # A crash between writing the batches and truncating the journal resends these items
        # in a later batch: harmless, the service is idempotent by (gpu_uuid, start)/event_id.
        entries, self._journal = self._journal, []
        for i in range(0, len(entries), self.batch_max_items):
            chunk = entries[i : i + self.batch_max_items]
            batch_id = str(uuid.uuid4())
            batch = {  # an IngestBatch as JSON; the entries are already its items' JSON
                "batch_id": batch_id,
                "records": [e["record"] for e in chunk if "record" in e],
                "events": [e["event"] for e in chunk if "event" in e],
                "protocol_version": PROTOCOL_VERSION,
            }
            self._seq += 1
            path = self.batch_dir / f"{self._seq:010d}-{batch_id}.json"
            data = json.dumps(batch).encode()
            write_atomic(path, data)
            self._batch_sizes[path] = len(data)

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

    # -- accounting -------------------------------------------------------------------------

    @staticmethod
    def _seq_of(path: Path) -> int:
        return int(path.name.split("-", 1)[0])

    def bytes(self) -> int:
        return self._journal_bytes + sum(self._batch_sizes.values())

    def held(self) -> int:
        return len(self._held)

    def _publish(self) -> None:
        m = self._metrics
        m.set("gpumeter_agent_spool_bytes", self.bytes())
        m.set("gpumeter_agent_spool_batches", len(self._batch_sizes))
        m.set("gpumeter_agent_spool_journal_items", len(self._journal))
        m.set("gpumeter_agent_spool_held_items", len(self._held))
        m.set("gpumeter_agent_spool_full", int(self.full))

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)
