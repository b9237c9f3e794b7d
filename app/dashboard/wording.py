"""How health facts read to a person: states, evidence and time ranges, never internal fields.

Evidence is what the agent attached to a state change (XID code, rule, the driver's message);
it is written as "XID 79: GPU has fallen off the bus", not ``code=79, rule=...``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.dashboard.formatting import Formatter, duration

STATES = {
    "healthy": "Healthy",
    "degraded": "Degraded",
    "failed": "Failed",
    "maintenance": "Maintenance",
    "unmetered": "No telemetry",
    "migration": "Moving to another GPU",
}


def state(name: str) -> str:
    return STATES.get(name, name.replace("_", " ").capitalize())


def span(start: int, end: int, fmt: Formatter) -> str:
    """``2026-10-10 14:00:00 to 14:47:00 CEST (47 min)``; the end's date only if it differs."""
    a, b = fmt.local(start), fmt.local(end)
    until = b.strftime("%H:%M:%S") if a.date() == b.date() else b.strftime("%Y-%m-%d %H:%M:%S")
    return f"{a:%Y-%m-%d %H:%M:%S} to {until} {b:%Z} ({duration(end - start)})"


def evidence(facts: Mapping[str, Any] | None) -> str:
    """The cause in words: XID and the driver's message, else the rule that fired."""
    facts = facts or {}
    detail = facts.get("detail") if isinstance(facts.get("detail"), Mapping) else facts
    message = detail.get("message") if isinstance(detail, Mapping) else None
    code = facts.get("code")
    parts = [f"XID {code}"] if code is not None else []
    if message:
        parts.append(str(message))
    elif facts.get("rule"):
        parts.append(rule(str(facts["rule"])))
    return ": ".join(parts)


# What a failure means to the customer, by XID code, else by the classifier's rule name.
_XID_CAUSES = {
    48: "Uncorrectable memory error (ECC)",
    64: "Memory repair failed (row remapping)",
    74: "NVLink connection error",
    79: "GPU stopped responding (fell off the bus)",
    95: "Uncorrectable memory error (ECC)",
    119: "GPU firmware stopped responding",
    120: "GPU firmware error",
    140: "Uncorrectable memory error (ECC)",
}
_RULE_CAUSES = {
    "gpu_lost": "GPU stopped responding",
    "ecc_uncorrected_volatile": "Uncorrectable memory error (ECC)",
    "ecc_dbe_event": "Uncorrectable memory error (ECC)",
    "row_remap_failure": "Memory repair failed (row remapping)",
    "recovery_action_required": "The GPU driver asked for a reset",
    "xid_events_failed": "The node could not read the GPU's error log",
}
OUT_OF_SERVICE = "GPU taken out of service"


def cause(code: int | None, rule_name: str | None) -> str:
    """A failure's cause as a customer reads it: ``Uncorrectable memory error (ECC) — GPU
    taken out of service``, never a rule name."""
    what = _XID_CAUSES.get(code or 0) or _RULE_CAUSES.get(rule_name or "")
    if what is None:
        what = f"GPU hardware error (XID {code})" if code is not None else "GPU hardware error"
    return f"{what} \u2014 {OUT_OF_SERVICE}"


def rule(name: str) -> str:
    """A classifier rule's name as words: ``xid_79_fallen_off_bus`` -> ``xid 79 fallen off bus``."""
    return name.replace("_", " ")


def event(kind: str, code: int | None, new_state: str | None, facts: Mapping[str, Any]) -> str:
    """One health event: ``XID 79: GPU has fallen off the bus`` or ``Became failed (...)``."""
    cause = evidence({"code": code, **facts})
    if kind == "state_change" and new_state:
        return f"Became {state(new_state).lower()}" + (f" ({cause})" if cause else "")
    if kind == "xid":
        return cause or "XID"
    return f"{kind.replace('_', ' ').capitalize()}" + (f": {cause}" if cause else "")
