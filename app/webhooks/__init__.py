"""Outgoing webhooks: domain events delivered to endpoints, signed per Standard Webhooks."""
