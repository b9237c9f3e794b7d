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
    driver's message), else "XID 79 (xid_79_fallen_off_bus)" (the rule that fired), or
    "migrated from GPU-A to GPU-B: XID 79", or for a stall credit "job stalled by GPU-A:
    <its own evidence>"; row ids and raw payloads are left out."""
    if not evidence:
        return ""
    if "stalled_by" in evidence:
        cause = {k: v for k, v in evidence.items() if k not in ("stalled_by", "bucket")}
        text = f"job stalled by {evidence['stalled_by']}"
        return f"{text}: {evidence_text(cause)}" if cause else text
    if "to_gpu" in evidence:
        text = f"migrated from {evidence.get('from_gpu')} to {evidence['to_gpu']}"
        return f"{text}: {evidence['reason']}" if evidence.get("reason") else text
    parts = []
    if (xid := xid_of(evidence)) is not None:
        parts.append(f"XID {xid}")
    detail = evidence.get("detail")
    if isinstance(detail, Mapping) and detail.get("message"):  # the driver's own words
        return ": ".join([*parts, str(detail["message"])])
    if rule := evidence.get("rule"):
        parts.append(f"({rule})" if parts else str(rule))
    return " ".join(parts)
