"""A credit's evidence (the health event or the migration behind it), read for customers.

API:
    xid_of(evidence) -> int | None
    evidence_text(evidence) -> str
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_XID_RULE = re.compile(r"^xid_(\d+)")
# NVIDIA's names for the XIDs that fail or degrade a GPU here (its XID catalog), for evidence
# that carries neither the driver's message nor a description of its own.
XID_DESCRIPTIONS = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    140: "Unrecovered ECC Error",
}


def xid_of(evidence: Mapping[str, Any] | None) -> int | None:
    """The NVIDIA XID behind a credit: the event's code, else the first XID among the
    classifier's evidence, else the one its rule names (``xid_79_fallen_off_bus``)."""
    if not evidence:
        return None
    if isinstance(evidence.get("code"), int):
        return int(evidence["code"])
    detail = evidence.get("detail")
    for item in detail.get("evidence", []) if isinstance(detail, Mapping) else []:
        if isinstance(item, Mapping) and isinstance(item.get("xid"), int):
            return int(item["xid"])
    match = _XID_RULE.match(str(evidence.get("rule", "")))
    return int(match.group(1)) if match else None


def evidence_text(evidence: Mapping[str, Any] | None) -> str:
    """A credit's evidence as a customer reads it: "XID 79: GPU has fallen off the bus" (the
    driver's message, else the description the evidence carries, else NVIDIA's name for the
    XID), or "migrated from GPU-A to GPU-B: XID 79", or for a stall credit "job stalled by
    GPU-A: <its own evidence>"; rule names, row ids and raw payloads are left out (a rule name
    is shown, in words, only when nothing else says what happened)."""
    if not evidence:
        return ""
    if "stalled_by" in evidence:
        cause = {k: v for k, v in evidence.items() if k not in ("stalled_by", "bucket")}
        text = f"job stalled by {evidence['stalled_by']}"
        return f"{text}: {evidence_text(cause)}" if cause else text
    if "to_gpu" in evidence:
        text = f"migrated from {evidence.get('from_gpu')} to {evidence['to_gpu']}"
        return f"{text}: {evidence['reason']}" if evidence.get("reason") else text
    xid = xid_of(evidence)
    parts = [] if xid is None else [f"XID {xid}"]
    if words := _described(evidence, xid):
        return ": ".join([*parts, words])
    if rule := evidence.get("rule"):
        parts.append(str(rule).replace("_", " "))
    return ": ".join(parts)


def _described(evidence: Mapping[str, Any], xid: int | None) -> str:
    detail = evidence.get("detail")
    detail = detail if isinstance(detail, Mapping) else {}
    for said in (detail.get("message"), detail.get("description"), evidence.get("description")):
        if said:
            return str(said)
    for item in detail.get("evidence", []):
        if isinstance(item, Mapping) and item.get("description"):
            return str(item["description"])
    return XID_DESCRIPTIONS.get(xid, "") if xid is not None else ""
