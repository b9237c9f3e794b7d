"""The customer dashboard (server-rendered HTML) and the admin's portal links.

Pages take the same principals as the console API (an API key, or the session cookie the
portal link or the sign-in form sets); a page that names another customer's object is a 404.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import Field
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.auth.deps import Admin, BearerCredentials, ConsoleUser, current_principal
from app.auth.models import KeyKind
from app.auth.service import Principal, authenticate
from app.auth.throttle import FailedAuthThrottle, client_address
from app.billing import html as invoice_html
from app.billing import wording as billing_wording
from app.billing.endpoints import Now
from app.billing.html import Seller
from app.billing.loader import PERIOD_PATTERN, BillingPeriod
from app.billing.usage import FORECAST_ASSUMES, UsageSettings
from app.budgets import service as budget_service
from app.budgets.models import Budget
from app.core.browser import same_origin
from app.core.db import transaction
from app.core.deps import AppSettings, DbSession
from app.core.epoch import from_epoch
from app.core.errors import ApiError, TooManyRequests, Unauthorized, error_responses
from app.core.money import display
from app.core.pagination import Page as PageOf
from app.core.pagination import Paging, page_of
from app.core.schemas import Schema
from app.customers.models import Customer
from app.customers.service import get_customer, revoke_portal_sessions
from app.dashboard import (
    costs,
    exports,
    focus,
    formatting,
    incidents,
    operators,
    pdf,
    service,
    sessions,
    wording,
)
from app.dashboard.bands import ROW_H, WIDTH
from app.dashboard.budgets import BudgetForm
from app.settings import get_settings

HERE = Path(__file__).parent
STATIC = HERE / "static"
TEMPLATES = Jinja2Templates(directory=HERE / "templates")
TEMPLATES.env.globals.update(
    hours=formatting.hours,
    money=display,
    duration=formatting.duration,
    shift_period=service.shift_period,
    line_label=billing_wording.label,
    document_style=Markup(invoice_html.STYLE),
    event_text=wording.event,
    ROW_H=ROW_H,
    WIDTH=WIDTH,
)

router = APIRouter(tags=["dashboard"])
pages = APIRouter(prefix="/dashboard", include_in_schema=False)
PeriodParam = Annotated[
    str | None, Query(pattern=PERIOD_PATTERN, description="YYYY-MM; default: the current month.")
]
StartParam = Annotated[
    date | None, Query(description="First day of a range (YYYY-MM-DD, customer's time zone).")
]
EndParam = Annotated[date | None, Query(description="Last day of the range, inclusive.")]
GroupByParam = Annotated[costs.GroupBy, Query(description="Group money by this.")]
# Pages show one customer's money: never let a shared cache keep them.
_PRIVATE = {"Cache-Control": "private, no-store"}


# --- portal links (JSON API) --------------------------------------------------------------


class PortalLinkCreate(Schema):
    ttl_s: int = Field(
        default=sessions.PORTAL_LINK_TTL_S, ge=60, le=30 * 86_400, description="Link lifetime."
    )


class PortalLinkRead(Schema):
    url: str = Field(
        description="Absolute on GPUMETER_PUBLIC_URL when set, else a path on this site."
    )
    expires_at: datetime


@router.post("/v1/customers/{customer_id}/portal-links", status_code=201)
def create_portal_link(
    customer_id: uuid.UUID,
    session: DbSession,
    admin: Admin,
    settings: AppSettings,
    body: PortalLinkCreate | None = None,
) -> PortalLinkRead:
    """A signed, expiring link that signs the customer into its dashboard (read-only)."""
    get_customer(session, customer_id, admin)
    link = sessions.portal_link(customer_id, (body or PortalLinkCreate()).ttl_s)
    # Absolute only from the configured address: a Host header is the client's to forge.
    path = f"/dashboard/portal/{link.token}"
    url = (settings.public_url or "").rstrip("/") + path
    return PortalLinkRead(url=url, expires_at=from_epoch(link.expires_at))


class PortalRevocation(Schema):
    revoked_at: datetime


@router.post("/v1/customers/{customer_id}/portal-links/revoke", responses=error_responses(404))
def revoke_portal_access(
    customer_id: uuid.UUID, session: DbSession, admin: Admin
) -> PortalRevocation:
    """End every portal link and dashboard session of the customer issued until now (its API
    keys stay valid; revoke those on their own). Links issued afterwards work."""
    customer = get_customer(session, customer_id, admin)
    return PortalRevocation(revoked_at=revoke_portal_sessions(session, customer))


@router.get("/v1/customers/{customer_id}/incidents")
def list_incidents(
    customer_id: uuid.UUID,
    session: DbSession,
    caller: ConsoleUser,
    now: Now,
    paging: Paging,
    settings: AppSettings,
    period: PeriodParam = None,
) -> PageOf[incidents.IncidentRead]:
    """The period's GPU failures and migrations on this customer's rentals, oldest first:
    cause, when the service heard of it, where the rental moved and how fast, the credit."""
    customer = get_customer(session, customer_id, caller)
    fmt = formatting.Formatter(customer.currency, customer.billing_timezone)
    billing_period = service.period_of(customer, period, now)
    config = UsageSettings.of(settings)
    found = incidents.incidents(session, customer, billing_period, now, fmt, config)
    return page_of(found, paging)


@router.get("/v1/customers/{customer_id}/costs", responses=error_responses(422))
def read_costs(
    customer_id: uuid.UUID,
    session: DbSession,
    caller: ConsoleUser,
    now: Now,
    settings: AppSettings,
    period: PeriodParam = None,
    start: StartParam = None,
    end: EndParam = None,
    group_by: GroupByParam = costs.GroupBy.RENTAL,
) -> costs.CostsRead:
    """Money per day (charges, the monthly cap's reduction, credits, net) and per group
    (rental, GPU model or datacenter) over a month (default: the current one) or a range of
    days, with billed, credited and idle GPU-seconds per day."""
    customer = get_customer(session, customer_id, caller)
    days = _cost_days(customer, period, start, end, now)
    config = UsageSettings.of(settings)
    return costs.costs_and_rated(session, customer, days, group_by, now, config)[0]


def _cost_days(
    customer: Customer, period: str | None, start: date | None, end: date | None, now: datetime
) -> costs.DayRange:
    """A month by name (default: the current one), or a range of days."""
    month = service.period_of(customer, period, now) if period or not (start or end) else None
    return costs.day_range(
        customer, month, start, end, now, lambda name: service.period_of(customer, name, now)
    )


@router.get("/v1/fleet/summary")
def fleet_summary(
    session: DbSession, _: Admin, now: Now, settings: AppSettings
) -> operators.FleetRead:
    """GPUs by model and datacenter (pool, last state, rented, spare level against its
    target), failures in the last 24 h, and the latencies that are measured."""
    return operators.fleet(session, now, settings.spare_target_percent)


MonthParam = Annotated[str | None, Query(pattern=PERIOD_PATTERN, description="YYYY-MM")]


@router.get("/v1/revenue")
def revenue(
    session: DbSession, _: Admin, now: Now, first: MonthParam = None, last: MonthParam = None
) -> operators.RevenueRead:
    """Per month and currency, and per customer: billed, credited, cap reductions,
    adjustments, vouchers, tax and total of the non-void invoices (default: the last 12
    months); a customer's current month without an invoice yet is rated to date."""
    last = last or now.strftime("%Y-%m")
    first = first or service.shift_period(last, -11)
    return operators.revenue(session, first, last, now, UsageSettings.of(get_settings()))


# --- exports (JSON API side: CSV bodies) ----------------------------------------------------


class ExportKind(StrEnum):
    USAGE = "usage.csv"
    FOCUS = "focus.csv"


_CSV: dict[int | str, dict[str, Any]] = {200: {"content": {"text/csv": {}}}}


def _export_route(kind: ExportKind, summary: str) -> None:
    """``GET /v1/customers/{id}/exports/<kind>``: one fixed route per format."""

    def export(
        customer_id: uuid.UUID,
        request: Request,
        session: DbSession,
        caller: ConsoleUser,
        now: Now,
        period: PeriodParam = None,
    ) -> StreamingResponse:
        customer = get_customer(session, customer_id, caller)
        billing_period = service.period_of(customer, period, now)
        return _export(request, session, customer, billing_period, kind, now)

    router.add_api_route(
        f"/v1/customers/{{customer_id}}/exports/{kind.value}",
        export,
        methods=["GET"],
        responses=_CSV,
        name=f"export_{kind.name.lower()}",
        description=summary + " Streamed; the amounts sum to the invoice's total (to date: to "
        "the cost to date, before vouchers and tax).",
    )


_export_route(
    ExportKind.USAGE,
    "The period's invoice (with none yet, the period to date) as cost and usage rows per "
    "rental, GPU and local day.",
)
_export_route(ExportKind.FOCUS, "The same rows in the FinOps FOCUS 1.2 cost and usage format.")


def _export(
    request: Request,
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    kind: ExportKind,
    now: datetime,
) -> StreamingResponse:
    settings = get_settings()
    # Errors before streaming.
    source = exports.statement(session, customer, period, now, UsageSettings.of(settings))
    engine, provider = request.app.state.engine, settings.provider_name

    def body() -> Iterator[str]:
        # Its own read-only transaction: the request's has committed when streaming begins.
        with transaction(engine) as stream:
            parts = exports.day_parts(stream, source)
            if kind is ExportKind.FOCUS:
                fmt = formatting.Formatter(customer.currency, customer.billing_timezone)
                book = focus.catalogue(stream, customer, source, fmt)
                yield from focus.focus_csv(parts, source, customer, provider, book)
            else:
                yield from exports.usage_csv(parts, source, customer.billing_timezone)

    name = f"gpumeter-{period.name}-{kind.value}"
    headers = {"Content-Disposition": f'attachment; filename="{name}"', **_PRIVATE}
    return StreamingResponse(body(), media_type="text/csv; charset=utf-8", headers=headers)


# --- sign-in ------------------------------------------------------------------------------


def page_principal(
    request: Request,
    session: DbSession,
    credentials: BearerCredentials,
) -> Principal:
    """The API's own principal; a browser without one is sent to the sign-in page."""
    try:
        principal = current_principal(request, session, credentials)
    except Unauthorized:
        target = "/dashboard/sign-in?" + urlencode({"next": _local(request)})
        raise HTTPException(303, "sign in first", headers={"Location": target}) from None
    if principal.kind == KeyKind.NODE:
        raise HTTPException(403, "node tokens cannot open the dashboard")
    return principal


PagePrincipal = Annotated[Principal, Depends(page_principal)]


def _local(request: Request) -> str:
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


def _safe_next(target: str | None) -> str:
    # Only paths on this site: never an open redirect to another host.
    if target and target.startswith("/dashboard") and not target.startswith("//"):
        return target
    return "/dashboard"


@pages.get("/portal/{token}", name="open_portal_link")
def open_portal_link(token: str, request: Request, session: DbSession) -> Response:
    """Sign in with the link; a browser signed in to another customer's dashboard (or as an
    admin) is asked first: another site may have sent it the link of a dashboard not its own."""
    session_token = _portal_session(request, token)
    current: Principal | None = getattr(request.state, "principal", None)
    target = sessions.link_customer(token)
    if current is not None and current.customer_id != target:
        return _render(
            request,
            "portal_confirm.html",
            token=token,
            target=service.customer_name(session, target),
            current=_who(session, current),
            signed_in=True,
        )
    return _switch_session(request, session_token)


def _from_this_site(request: Request, settings: AppSettings) -> None:
    same_origin(request, settings.public_url)


@pages.post("/portal/{token}", dependencies=[Depends(_from_this_site)])
def confirm_portal_link(token: str, request: Request) -> Response:
    """The confirmation form's answer: end the open session, sign in with the link."""
    return _switch_session(request, _portal_session(request, token))


def _portal_session(request: Request, token: str) -> str:
    session_token = sessions.session_from_portal(token, request.app.state.engine)
    if session_token is None:
        raise HTTPException(
            401, "this portal link is invalid, expired or revoked; ask for a new one"
        )
    return session_token


def _switch_session(request: Request, session_token: str) -> Response:
    _end_session(request)
    response = RedirectResponse("/dashboard", status_code=303)
    sessions.set_session_cookie(response, session_token)
    return response


def _end_session(request: Request) -> None:
    claims = sessions.session_claims(request)
    if claims is not None and "sid" in claims:
        sessions.sign_out(claims, request.app.state.engine)


def _who(session: Session, principal: Principal) -> str:
    if principal.customer_id is None:
        return "the provider (an administrator)"
    return service.customer_name(session, principal.customer_id)


@pages.get("/sign-in", name="sign_in_form")
def sign_in_form(request: Request, next: str | None = None, error: str | None = None) -> Response:
    return _render(request, "sign_in.html", next=_safe_next(next), error=error)


async def _form(request: Request) -> dict[str, str]:
    # A urlencoded form, parsed without python-multipart (the one form here has two fields).
    body = (await request.body()).decode(errors="replace")
    return {k: v[0] for k, v in parse_qs(body, max_num_fields=10).items()}


@pages.post("/sign-in", dependencies=[Depends(_from_this_site)])
def sign_in(
    request: Request, session: DbSession, form: Annotated[dict[str, str], Depends(_form)]
) -> Response:
    target = _safe_next(form.get("next"))
    key, address = form.get("api_key", "").strip()[:200], client_address(request.scope)
    throttle: FailedAuthThrottle = request.app.state.auth_throttle
    if (wait := throttle.key_refused(key)) is not None:
        raise TooManyRequests.after(wait)
    principal = authenticate(session, key)
    if principal is None or principal.kind not in sessions.PEOPLE:
        # A valid key is served from a throttled address; a failure there is answered 429.
        wait = throttle.address_throttled(address)
        throttle.failed(address, key)
        if wait is not None:
            raise TooManyRequests.after(wait)
        query = urlencode({"error": "invalid", "next": target})
        return RedirectResponse(f"/dashboard/sign-in?{query}", status_code=303)
    response = RedirectResponse(target, status_code=303)
    sessions.set_session_cookie(response, sessions.session_from_key(principal))
    return response


@pages.post("/sign-out", dependencies=[Depends(_from_this_site)])
def sign_out(request: Request) -> Response:
    """End the session on the server too: a copy of the cookie stops working."""
    _end_session(request)
    response = RedirectResponse("/dashboard/sign-in", status_code=303)
    sessions.clear_session_cookie(response)
    return response


# --- pages --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One page request: the viewer (who looks at which customer) and the request's "now"."""

    request: Request
    session: Session
    v: service.Viewer
    now: datetime

    def period(self, name: str | None) -> BillingPeriod:
        return service.period_of(self.v.customer, name, self.now)

    def render(self, template: str, status_code: int = 200, **context: Any) -> Response:
        current = service.current_period_of(self.v.customer, self.now)
        period = context.get("period")
        closed = period is not None and service.is_closed(period, self.now)
        return _render(
            self.request,
            template,
            status_code,
            v=self.v,
            current_period=current,
            closed=closed,
            **context,
        )


def page(
    request: Request,
    session: DbSession,
    principal: PagePrincipal,
    now: Now,
    customer: Annotated[uuid.UUID | None, Query()] = None,
) -> Page:
    if customer is None and principal.is_admin:  # an admin first picks a customer
        raise HTTPException(303, "choose a customer", headers={"Location": "/dashboard/customers"})
    return Page(request, session, service.viewer(session, principal, customer), now)


CustomerPage = Annotated[Page, Depends(page)]


@pages.get("/customers", name="customers")
def customers_page(request: Request, session: DbSession, admin: PagePrincipal) -> Response:
    if not admin.is_admin:
        return RedirectResponse("/dashboard", status_code=303)
    customers = service.all_customers(session)
    return _render(
        request, "customers.html", customers=customers, signed_in=True, admin_nav="customers"
    )


@pages.get("/fleet", name="fleet")
def fleet_page(request: Request, session: DbSession, admin: PagePrincipal, now: Now) -> Response:
    if not admin.is_admin:
        return RedirectResponse("/dashboard", status_code=303)
    data = operators.fleet(session, now, get_settings().spare_target_percent)
    fmt = formatting.Formatter("USD", "UTC")
    return _render(request, "fleet.html", f=data, fmt=fmt, signed_in=True, admin_nav="fleet")


@pages.get("/revenue", name="revenue")
def revenue_page(request: Request, session: DbSession, admin: PagePrincipal, now: Now) -> Response:
    if not admin.is_admin:
        return RedirectResponse("/dashboard", status_code=303)
    last = now.strftime("%Y-%m")
    config = UsageSettings.of(get_settings())
    data = operators.revenue(session, service.shift_period(last, -11), last, now, config)
    return _render(request, "revenue.html", r=data, signed_in=True, admin_nav="revenue")


@pages.get("", name="overview")
def overview_page(p: CustomerPage, period: PeriodParam = None) -> Response:
    billing_period = p.period(period)
    settings = get_settings()
    low_balance, config = settings.balance_low_threshold, UsageSettings.of(settings)
    data = service.overview(p.session, p.v, billing_period, p.now, low_balance, config)
    return p.render("overview.html", period=billing_period, o=data, u=data.usage)


@pages.get("/rentals/{rental_id}", name="rental")
def rental_page(
    p: CustomerPage,
    rental_id: uuid.UUID,
    period: PeriodParam = None,
    gpu_page: Annotated[int, Query(ge=1, le=100_000, description="Page of the GPU bands")] = 1,
) -> Response:
    billing_period = p.period(period)
    config = UsageSettings.of(get_settings())
    view = service.rental_page(p.session, p.v, rental_id, billing_period, p.now, config, gpu_page)
    return p.render("rental.html", period=billing_period, page=view)


@pages.get("/invoices", name="invoices")
def invoices_page(p: CustomerPage) -> Response:
    return p.render("invoices.html", invoices=service.invoices(p.session, p.v))


@pages.get("/invoices/{invoice_id}", name="invoice")
def invoice_page(p: CustomerPage, invoice_id: uuid.UUID) -> Response:
    view = service.invoice(p.session, p.v, invoice_id, p.now, Seller.of(get_settings()))
    return p.render("invoice.html", inv=view.invoice, view=view, due=view.due)


@pages.get("/invoices/{invoice_id}/pdf", name="invoice_pdf")
def invoice_pdf(p: CustomerPage, invoice_id: uuid.UUID) -> Response:
    view = service.invoice(p.session, p.v, invoice_id, p.now, Seller.of(get_settings()))
    inv = view.invoice
    name = f"invoice-{inv.number or 'draft-' + inv.period}.pdf"
    return Response(
        pdf.render(view.document),
        media_type="application/pdf",
        headers={"Content-Disposition": f'attachment; filename="{name}"', **_PRIVATE},
    )


@pages.get("/costs", name="costs")
def costs_page(
    p: CustomerPage,
    period: PeriodParam = None,
    start: StartParam = None,
    end: EndParam = None,
    group_by: GroupByParam = costs.GroupBy.RENTAL,
) -> Response:
    days = _cost_days(p.v.customer, period, start, end, p.now)
    config = UsageSettings.of(get_settings())
    data, rated = costs.costs_and_rated(p.session, p.v.customer, days, group_by, p.now, config)
    kinds = sorted({k for g in data.groups for k in g.by_kind}, key=costs.KIND_ORDER.index)
    billing_period = days.periods[-1] if data.period else None
    return p.render(
        "costs.html",
        period=billing_period,
        c=data,
        chart=costs.chart(data),
        kinds=kinds,
        group_by=group_by,
        group_names=_GROUP_NAMES,
        # The path to the amount due is a month's: a range of days has none.
        due=billing_period
        and service.period_amount_due(p.session, p.v, billing_period, p.now, config, rated),
    )


_GROUP_NAMES = {
    costs.GroupBy.RENTAL: "Rental",
    costs.GroupBy.GPU_MODEL: "GPU model",
    costs.GroupBy.DATACENTER: "Datacenter",
}


@pages.get("/incidents", name="incidents")
def incidents_page(p: CustomerPage, period: PeriodParam = None) -> Response:
    billing_period = p.period(period)
    config = UsageSettings.of(get_settings())
    found = incidents.incidents(p.session, p.v.customer, billing_period, p.now, p.v.fmt, config)
    credits = (c for i in found for c in (i.credited, i.stall_credited) if c)
    credited = sum((Decimal(c) for c in credits), Decimal(0))
    return p.render("incidents.html", period=billing_period, incidents=found, credited=credited)


# --- budgets (the dashboard's one editable object) -----------------------------------------


def form_page(
    request: Request,
    session: DbSession,
    now: Now,
    settings: AppSettings,
    customer: Annotated[uuid.UUID | None, Query()] = None,
) -> Page:
    """A dashboard form's post, by the signed-in session (its cookie authenticates no other
    POST): refused unless it came from this site's own page (``same_origin``; the Lax cookie is
    not sent with another site's POST either)."""
    same_origin(request, settings.public_url)
    claims = sessions.session_claims(request)
    engine = request.app.state.engine
    principal = None if claims is None else sessions.principal_from_claims(claims, engine)
    if principal is None:
        target = "/dashboard/sign-in?" + urlencode({"next": "/dashboard/budgets"})
        raise HTTPException(303, "sign in first", headers={"Location": target})
    return Page(request, session, service.viewer(session, principal, customer), now)


FormPage = Annotated[Page, Depends(form_page)]
FormFields = Annotated[dict[str, str], Depends(_form)]


@pages.get("/budgets", name="budgets")
def budgets_page(p: CustomerPage) -> Response:
    return _budgets(p, BudgetForm.of(None))


@pages.post("/budgets")
def create_budget(p: FormPage, form: FormFields) -> Response:
    body = BudgetForm.posted(form).create()
    if isinstance(body, BudgetForm):
        return _budgets(p, body, 422)
    cap = get_settings().max_budgets_per_customer
    budget_service.create_budget(p.session, p.v.customer, body, p.v.principal, cap)
    return RedirectResponse(p.v.url("/dashboard/budgets"), status_code=303)


@pages.get("/budgets/{budget_id}", name="budget")
def budget_page(p: CustomerPage, budget_id: uuid.UUID) -> Response:
    budget = service.customer_budget(p.session, p.v, budget_id)
    return _budget(p, budget, BudgetForm.of(budget))


@pages.post("/budgets/{budget_id}")
def change_budget(p: FormPage, budget_id: uuid.UUID, form: FormFields) -> Response:
    budget = service.customer_budget(p.session, p.v, budget_id)
    body = BudgetForm.posted(form).update()
    if isinstance(body, BudgetForm):
        return _budget(p, budget, body, 422)
    budget_service.update_budget(p.session, budget, body)
    return RedirectResponse(p.v.url("/dashboard/budgets"), status_code=303)


@pages.post("/budgets/{budget_id}/delete")
def delete_budget(p: FormPage, budget_id: uuid.UUID) -> Response:
    p.session.delete(service.customer_budget(p.session, p.v, budget_id))
    return RedirectResponse(p.v.url("/dashboard/budgets"), status_code=303)


def _budgets(p: Page, form: BudgetForm, status_code: int = 200) -> Response:
    return _budget_page(p, "budgets.html", form, status_code, None)


def _budget(p: Page, budget: Budget, form: BudgetForm, status_code: int = 200) -> Response:
    return _budget_page(p, "budget.html", form, status_code, budget)


def _budget_page(
    p: Page, template: str, form: BudgetForm, status_code: int, budget: Budget | None
) -> Response:
    """The budgets list, or one budget's page (``budget``): each against this month."""
    view = service.budgets_view(p.session, p.v, p.now, UsageSettings.of(get_settings()))
    shown = [s for s in view.statuses if budget is not None and s.budget.id == budget.id]
    return p.render(
        template,
        status_code=status_code,
        period=view.period,
        view=view,
        s=shown[0] if shown else None,
        form=form,
        assumes=FORECAST_ASSUMES,
    )


@pages.get("/exports/{kind}", name="export")
def export_page(p: CustomerPage, kind: ExportKind, period: PeriodParam = None) -> Response:
    return _export(p.request, p.session, p.v.customer, p.period(period), kind, p.now)


@pages.get("/what-if", name="what_if")
def what_if_page(p: CustomerPage, period: PeriodParam = None) -> Response:
    billing_period = p.period(period)
    config = UsageSettings.of(get_settings())
    table = service.what_if(p.session, p.v, billing_period, p.now, config)
    capped = service.capped_rows(table)
    return p.render("what_if.html", period=billing_period, table=table, capped=capped)


def _render(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    values = {"v": None, "fmt": None, "signed_in": False, "admin_nav": None, **context}
    if values["v"] is not None:
        values["fmt"] = values["v"].fmt
        values["signed_in"] = True
    return TEMPLATES.TemplateResponse(
        request, template, values, status_code=status_code, headers=_PRIVATE
    )


# --- errors as pages ----------------------------------------------------------------------

_TITLES = {
    401: "Sign in again",
    403: "Not allowed",
    404: "Not found",
    422: "That address is not valid",
}


def _wants_page(request: Request) -> bool:
    path = request.url.path
    return path.startswith("/dashboard") and not path.startswith("/dashboard/static")


def _html_errors(app: FastAPI) -> None:
    """Dashboard routes answer errors with a page; the API's JSON handler says what failed."""
    for kind in (ApiError, RequestValidationError, StarletteHTTPException):
        as_json = app.exception_handlers[kind]

        async def handler(request: Request, exc: Exception, as_json: Any = as_json) -> Response:
            response: Response = await as_json(request, exc)
            if response.status_code < 400 or not _wants_page(request):
                return response
            return _error_page(request, response)

        app.add_exception_handler(kind, handler)


def _error_page(request: Request, response: Response) -> Response:
    status = response.status_code
    problems = [_problem(item) for item in json.loads(bytes(response.body))["detail"]]
    return _render(
        request,
        "error.html",
        status_code=status,
        status=status,
        title=_TITLES.get(status, "Something went wrong"),
        problems=problems,
    )


def _problem(item: dict[str, Any]) -> str:
    if item.get("loc") == ["query", "period"] and item.get("type") == "string_pattern_mismatch":
        return "period must be a month written YYYY-MM, for example 2026-10 (period)"
    where = [str(part) for part in item.get("loc", []) if part not in ("path", "query", "body")]
    return f"{item['msg']} ({'.'.join(where)})" if where else str(item["msg"])


def root() -> RedirectResponse:
    """``/`` sends a person to the dashboard (its sign-in when signed out); the API's
    reference is at /docs."""
    return RedirectResponse("/dashboard", status_code=307, headers={"Link": '</docs>; rel="help"'})


def favicon() -> FileResponse:
    return FileResponse(STATIC / "favicon.ico", media_type="image/x-icon")


def install(app: FastAPI) -> None:
    """What the dashboard needs besides its routers: assets, the cookie session, error pages.

    Call after ``install_error_handlers``: the page handlers wrap the API's JSON ones.
    """
    app.mount("/dashboard/static", StaticFiles(directory=STATIC), name="dashboard_static")
    app.add_api_route("/favicon.ico", favicon, include_in_schema=False)
    app.add_api_route("/", root, include_in_schema=False)
    app.add_middleware(sessions.SessionCookieMiddleware)
    _html_errors(app)
