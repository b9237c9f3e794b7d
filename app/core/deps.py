"""Request-scoped dependencies: the one transaction of a request, and the settings the
endpoints hand their services (services never read settings themselves)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session

from app.core.db import transaction
from app.core.errors import BIGINT_MAX
from app.settings import Settings, get_settings

# Where a middleware that opened the request's transaction itself (``app.core.idempotency``)
# leaves it, in the request's state, for the session dependency to lend to the endpoint.
OPENED_TRANSACTION = "opened_transaction"


class OpenedTransaction:
    """A request's transaction opened, and committed or rolled back, by a middleware: the
    endpoint's work joins it; ``failed`` says whether the endpoint raised (then it must not
    commit)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.failed = False

    def lend(self) -> Iterator[Session]:
        try:
            yield self.session
        except BaseException:
            self.failed = True
            raise


def _request_session(request: Request) -> Iterator[Session]:
    # scope="function" below: the commit happens before the response is sent, so a client
    # never sees 2xx for work that then failed to commit.
    opened: OpenedTransaction | None = request.scope.get("state", {}).get(OPENED_TRANSACTION)
    if opened is not None:
        yield from opened.lend()
        return
    with transaction(request.app.state.engine) as session:
        yield session


DbSession = Annotated[Session, Depends(_request_session, scope="function")]
AppSettings = Annotated[Settings, Depends(get_settings)]

# A row id in the path (a BIGINT identity): out of its range is a 422 naming the parameter,
# never a statement the database refuses.
RowId = Annotated[int, Path(ge=1, le=BIGINT_MAX)]
