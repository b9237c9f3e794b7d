"""``GET /metrics``: Prometheus metrics of this process, and the job queue's depth.

Job durations, start delays and webhook deliveries are counted by the process that runs the
jobs: the service's in-process worker shows them here, a separate ``gpumeter worker`` on its
``--metrics-port``. The queue depth is read from the database at each scrape, so every
process shows the same, whole-queue figure. The service mounts the route behind an admin key
unless ``GPUMETER_METRICS_PUBLIC`` opens it (``app.auth.deps.metrics_reader``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

router = APIRouter(tags=["operations"])

QUEUE_JOBS = Gauge(
    "gpumeter_queue_jobs",
    "Jobs in the queue by task and status (todo includes those scheduled for later).",
    ["task", "status"],
)
# The failure loop (app.failover observes them where it records each step), by trigger:
# a degraded move's clock starts at the policy's decision, a failure's at its first second.
_FAILOVER_BUCKETS = (0.5, 1, 2, 3, 5, 10, 15, 30, 60, 120, 300, 900)
FAILOVER_DETECTION_SECONDS = Histogram(
    "gpumeter_failover_detection_seconds",
    "First failed second (telemetry) to the service knowing of the failure.",
    ["datacenter", "model", "trigger"],
    buckets=_FAILOVER_BUCKETS,
)
FAILOVER_REQUEST_SECONDS = Histogram(
    "gpumeter_failover_request_seconds",
    "First failed second to failover.requested (or failover.no_spare).",
    ["datacenter", "model", "trigger"],
    buckets=_FAILOVER_BUCKETS,
)
FAILOVER_RESUME_SECONDS = Histogram(
    "gpumeter_failover_resume_seconds",
    "First failed second to the job resumed on the spare.",
    ["datacenter", "model", "trigger"],
    buckets=_FAILOVER_BUCKETS,
)
SLURM_JOB_PROBLEMS = Counter(
    "gpumeter_slurm_job_problems_total",
    "Slurm jobs that could not be attributed, once per job and cause (unknown_account, "
    "unknown_node, unknown_gpu_index, mixed_models, rental_refused, bad_end, vanished).",
    ["reason"],
)
_DEPTH = text(
    "SELECT task_name, status::text, count(*) FROM procrastinate_jobs "
    "WHERE status IN ('todo', 'doing') GROUP BY task_name, status"
)


@router.get(
    "/metrics",
    response_class=Response,
    responses={503: {"description": "database unreachable or not migrated"}},
)
def metrics(request: Request) -> Response:
    try:
        with request.app.state.engine.connect() as connection:
            rows = connection.execute(_DEPTH).all()
    except SQLAlchemyError as error:
        reason = f"queue depth unavailable: {type(error).__name__}"
        return Response(reason, status_code=503, media_type="text/plain")
    QUEUE_JOBS.clear()
    for task, status, count in rows:
        QUEUE_JOBS.labels(task, status).set(count)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
