"""Domain events: an outbox of what happened, written in the transaction of the change."""
