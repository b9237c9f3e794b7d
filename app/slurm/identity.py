"""Which GPU a Slurm job really got: GRES index -> device file -> minor number -> UUID.

Slurm names a job's GPUs by GRES index (``gres_detail``'s ``gpu:2(IDX:0-1)``): the position of
the device in the node's list of ``gpu`` device files, which slurmd builds from gres.conf's
``File=`` records in the order they are written, each record's bracket list expanded in the
order written (``File=/dev/nvidia[2,0,3,1]``: index 0 is /dev/nvidia2). With
``AutoDetect=nvml`` slurmd sorts the records by the device file's number. NVML's own index
(PCI bus order) is another numbering: matching the two bills and credits the wrong GPU as soon
as a node's gres.conf lists its files in another order.

What both sides agree on is the device file: /dev/nvidia<minor>, and NVML says each GPU's
minor number (``nvmlDeviceGetMinorNumber``), which the agent reports. So:

- the adapter reads gres.conf (the one slurmd reads: beside slurm.conf, shared or served
  configless) and sends, with each node's GRES indices, their device files' minor numbers
  (``NodeGpus.minors``), or, for a node whose GPUs Slurm autodetects, that Slurm orders them
  by minor number (``NodeGpus.minor_order``);
- the service matches minor numbers to the GPUs the node's agent reported.

An agent too old to report minor numbers keeps working where the index cannot be wrong: the
gres.conf file at each index is /dev/nvidia<that index> (the NVML index is then assumed to be
the minor number, as on most nodes), or the adapter has no gres.conf for the node (the
NVML index, as before). A permuted gres.conf with such an agent is a problem
(``gpu_identity_unknown``), never a guess.

GRES gpumeter does not bill, reported as problems, never dropped: ``shard`` and ``mps`` (a
share of a GPU other jobs may hold at once: gpumeter bills whole GPUs by the second, one
holder at a time) and MIG slices (a GPU type named by its MIG profile, e.g.
``gpu:1g.10gb:1``, or a gres.conf record of several files: gpumeter meters whole GPUs).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import hostlist

from app.slurm.schemas import JobObservation, NodeGpus

log = logging.getLogger(__name__)

GPU = "gpu"
SHARED_GRES = frozenset({"shard", "mps"})  # shares of a GPU, held by several jobs at once
# A GPU type that is a MIG profile (AutoDetect=nvml names MIG slices so): 1g.10gb, 3g.40gb+me.
MIG_TYPE = re.compile(r"^\d+g\.\d+gb(\+\w+)?$", re.IGNORECASE)
_TRAILING_NUMBER = re.compile(r"(\d+)$")


# --- gres_detail: what squeue says a job holds on one node -------------------------------------


@dataclass(frozen=True)
class HeldGres:
    """One node's entry of ``gres_detail``, sorted into what gpumeter bills and what not."""

    gpu_indices: list[int] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)  # shard/mps entries, as Slurm wrote them
    mig: list[str] = field(default_factory=list)  # MIG slice entries


def held_gres(detail: str) -> HeldGres:
    """``gpu:2(IDX:0-1)``, ``gpu:h100:1(IDX:0,2-3)``, ``shard:2(IDX:0)``, ``mps:50(CNT:50)``,
    ``gpu:1g.10gb:1(IDX:4)``; other GRES (``nic``) are not GPUs and are left out."""
    held = HeldGres()
    for entry in _entries(detail):
        head, _, body = entry.partition("(")
        name, gres_type = _name_and_type(head)
        if name in SHARED_GRES:
            held.shared.append(entry)
        elif name == GPU and gres_type is not None and MIG_TYPE.match(gres_type):
            held.mig.append(entry)
        elif name == GPU and body.startswith("IDX:"):
            held.gpu_indices.extend(_indices(body.removeprefix("IDX:").rstrip(")")))
    return held


def _entries(detail: str) -> Iterator[str]:
    """The comma-separated entries, commas inside ``(IDX:0,2-3)`` kept."""
    depth, start = 0, 0
    for position, char in enumerate(detail):
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            yield detail[start:position].strip()
            start = position + 1
    if detail[start:].strip():
        yield detail[start:].strip()


def _name_and_type(head: str) -> tuple[str, str | None]:
    """``gpu``, ``gpu:2``, ``gpu:h100``, ``gpu:h100:2`` -> (name, type or None)."""
    parts = head.split(":")
    kinds = [part for part in parts[1:] if part and not part.isdigit()]
    return parts[0].strip().lower(), (kinds[0] if kinds else None)


def _indices(listed: str) -> list[int]:
    found: list[int] = []
    for part in filter(None, listed.split(",")):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            found.extend(range(int(first), int(last or first) + 1))
    return found


# --- gres.conf: which device file each GRES index is -------------------------------------------


@dataclass(frozen=True)
class Device:
    """A GPU GRES of a node, at its index: its device file's minor number (None: a record
    with no ``File=``), and whether it is a MIG slice (several files, ``MultipleFiles=``)."""

    minor: int | None
    mig: bool = False


@dataclass(frozen=True)
class NodeDevices:
    devices: list[Device]
    autodetect: bool  # AutoDetect=nvml: Slurm orders the node's GPUs by minor number


@dataclass
class _Record:
    nodes: list[str] | None  # None: every node
    devices: list[Device]


class GresConf:
    """gres.conf as slurmd reads it, for the GPU devices of each node."""

    def __init__(self, text: str, directory: Path | None = None) -> None:
        self._records: list[_Record] = []
        self._autodetect: dict[str | None, bool] = {}  # node (None: the default) -> on
        self._nodes: dict[str, NodeDevices | None] = {}  # worked out once per node
        for line in _lines(text, directory):
            self._read(line)

    def node(self, name: str) -> NodeDevices | None:
        """The node's GPU devices in GRES index order; None when gres.conf says nothing of the
        node's GPUs (Slurm then knows their count only, from slurm.conf)."""
        if name not in self._nodes:
            self._nodes[name] = self._node(name)
        return self._nodes[name]

    def _node(self, name: str) -> NodeDevices | None:
        records = [r for r in self._records if r.nodes is None or name in r.nodes]
        devices = [device for record in records for device in record.devices]
        autodetect = self._autodetect.get(name, self._autodetect.get(None, False))
        if autodetect and all(d.minor is not None for d in devices):
            devices.sort(key=lambda d: d.minor or 0)  # slurmd's merge with what it detects
        if not devices and not autodetect:
            return None
        return NodeDevices(devices, autodetect)

    def _read(self, line: dict[str, str]) -> None:
        nodes = hostlist.expand_hostlist(line["nodename"]) if "nodename" in line else None
        if "autodetect" in line:
            on = line["autodetect"].lower() not in ("off", "none", "")
            for node in nodes or [None]:
                self._autodetect[node] = on
        if line.get("name", "").lower() != GPU:
            return
        if "multiplefiles" in line:  # one GRES of several files: a MIG slice
            self._records.append(_Record(nodes, [Device(None, mig=True)]))
        elif "file" in line:
            self._records.append(_Record(nodes, [Device(m) for m in _minors(line["file"])]))
        else:
            self._records.append(_Record(nodes, [Device(None)] * _count(line.get("count", "1"))))


def _lines(text: str, directory: Path | None) -> Iterator[dict[str, str]]:
    """Each line's ``key=value`` pairs (keys lower case), ``Include`` files read in place."""
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if words[0].lower() == "include" and len(words) > 1 and directory is not None:
            included = directory / words[1]
            if included.is_file():
                yield from _lines(included.read_text(), directory)
            continue
        pairs = (word.partition("=") for word in words)
        yield {key.lower(): value for key, _, value in pairs}


def _minors(files: str) -> list[int | None]:
    """``/dev/nvidia[2,0,3,1]`` -> [2, 0, 3, 1]: the files in the order written, each one's
    number (Slurm's device number: the digits that end its name)."""
    numbers = (_TRAILING_NUMBER.search(name) for name in hostlist.expand_hostlist(files))
    return [int(number.group(1)) if number else None for number in numbers]


def _count(value: str) -> int:
    number = re.match(r"\d+", value)
    return int(number.group(0)) if number else 1


class GresLayout:
    """The provider's gres.conf (None: none given), read again when it changes: each round
    looks at its modification time. Without one, GRES indices are sent as Slurm gave them."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: float | None = None
        self._conf: GresConf | None = None
        self._missing_logged = False

    def conf(self) -> GresConf | None:
        if self.path is None:
            return None
        try:
            stamp = self.path.stat().st_mtime
        except FileNotFoundError:
            if not self._missing_logged:  # once, not every round
                log.warning("slurm_gres_conf_missing", extra={"path": str(self.path)})
                self._missing_logged = True
            return None
        if stamp != self._stamp:
            self._stamp, self._conf = stamp, GresConf(self.path.read_text(), self.path.parent)
            self._missing_logged = False
        return self._conf

    def identify(self, jobs: dict[int, JobObservation]) -> dict[int, JobObservation]:
        """The jobs with each node's GPUs named by device (see the module's rule)."""
        conf = self.conf()
        if conf is None:
            return jobs
        return {
            job_id: job.model_copy(update={"allocation": [_named(conf, h) for h in job.allocation]})
            if job.allocation
            else job
            for job_id, job in jobs.items()
        }


def _named(conf: GresConf, held: NodeGpus) -> NodeGpus:
    node = conf.node(held.node)
    if node is None:
        return held
    if not node.devices:
        return held.model_copy(update={"minor_order": True})
    listed = [node.devices[i] if i < len(node.devices) else None for i in held.gpu_indices]
    mig = [f"gpu(IDX:{i}) has several device files (MIG)" for i, d in
           zip(held.gpu_indices, listed, strict=True) if d is not None and d.mig]  # fmt: skip
    minors = [d.minor for d in listed if d is not None and d.minor is not None]
    known = len(minors) == len(held.gpu_indices)
    return held.model_copy(update={"minors": minors if known else None, "mig": [*held.mig, *mig]})


# --- the service: which of the node's GPUs those are -------------------------------------------


class ReportedGpu(Protocol):
    """A GPU as its node's agent reported it (the fleet's ``Gpu``)."""

    @property
    def device_index(self) -> int | None: ...

    @property
    def minor_number(self) -> int | None: ...


G = TypeVar("G", bound=ReportedGpu)


class Unresolved(Exception):
    """The job's GPUs cannot be named (a reason, and what to do about it)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def gpus_held(allocation: Iterable[NodeGpus], nodes: Mapping[str, list[G]]) -> list[G]:
    """The GPUs Slurm gave the job, node by node (see the module's rule)."""
    found: list[G] = []
    for held in allocation:
        _refuse_unmetered(held)
        gpus = nodes.get(held.node)
        if not gpus:
            why = "is not a gpumeter node" if gpus is None else "has reported no GPUs"
            raise Unresolved(
                "unknown_node",
                f"node {held.node!r} {why}: register it (POST /v1/nodes, hostname = its Slurm "
                "NodeName) and run gpumeter-agent on it",
            )
        found += _on_node(held, gpus)
    return found


def _refuse_unmetered(held: NodeGpus) -> None:
    if held.shared:
        raise Unresolved(
            "shared_gpu_unsupported",
            f"the job holds a share of a GPU on {held.node!r} ({', '.join(held.shared)}): "
            "gpumeter bills whole GPUs, one job at a time; shard/MPS jobs are not billed",
        )
    if held.mig:
        raise Unresolved(
            "mig_unsupported",
            f"the job holds MIG slices on {held.node!r} ({', '.join(held.mig)}): gpumeter "
            "meters whole GPUs; MIG jobs are not billed",
        )


def _on_node(held: NodeGpus, gpus: list[G]) -> list[G]:
    by_minor = {g.minor_number: g for g in gpus if g.minor_number is not None}
    if held.minors is not None and by_minor:
        return _pick(held, by_minor, held.minors, "minor number", "unknown_gpu_minor")
    if held.minors is not None and held.minors != held.gpu_indices:
        files = ", ".join(
            f"{i} is device {m}" for i, m in zip(held.gpu_indices, held.minors, strict=True)
        )
        raise Unresolved(
            "gpu_identity_unknown",
            f"on node {held.node!r} gres.conf's GRES index {files}, and its agent reports no "
            "minor numbers to tell which GPU that is: upgrade gpumeter-agent on it",
        )
    if held.minor_order and len(by_minor) == len(gpus):
        ordered = [by_minor[m] for m in sorted(by_minor)]
        return _pick(
            held, dict(enumerate(ordered)), held.gpu_indices, "position by minor number",
            "unknown_gpu_index",
        )  # fmt: skip
    by_index = {g.device_index: g for g in gpus if g.device_index is not None}
    return _pick(held, by_index, held.gpu_indices, "index", "unknown_gpu_index")


def _pick(
    held: NodeGpus, known: Mapping[int, G], wanted: list[int], what: str, reason: str
) -> list[G]:
    missing = [n for n in wanted if n not in known]
    if missing:
        raise Unresolved(
            reason,
            f"node {held.node!r} GPU {what}(es) {missing} have no reported UUID (reported: "
            f"{sorted(known)}): is gres.conf's File= list the node's devices, and its agent "
            "running?",
        )
    return [known[n] for n in wanted]
