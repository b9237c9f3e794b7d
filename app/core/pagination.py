"""Limit/offset pagination shared by every list endpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Depends, Query
from pydantic import BaseModel
from sqlalchemy import Select
from sqlalchemy.orm import Session

T = TypeVar("T", bound=BaseModel)


# Postgres OFFSET is a BIGINT; far below its end, so offset + limit never overflows either.
MAX_OFFSET = 2**62


@dataclass(frozen=True)
class PageParams:
    limit: int
    offset: int


def _page_params(
    limit: Annotated[int, Query(ge=1, le=1000, description="Items per page.")] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Items to skip.")] = 0,
) -> PageParams:
    return PageParams(limit=limit, offset=offset)


Paging = Annotated[PageParams, Depends(_page_params)]


class Page(BaseModel, Generic[T]):
    items: list[T]
    limit: int
    offset: int
    next_offset: int | None  # None on the last page


def paginate(
    session: Session,
    query: Select[Any],
    page: PageParams,
    schema: type[T],
    convert: Callable[[Any], T] | None = None,
) -> Page[T]:
    """One page of ``query``'s rows as ``schema``; one extra row tells whether more follow."""
    rows = session.scalars(query.limit(page.limit + 1).offset(page.offset)).all()
    next_offset = page.offset + page.limit if len(rows) > page.limit else None
    to_item = convert or schema.model_validate
    # Parametrised at run time so the items serialise as ``schema``, not as bare BaseModels.
    page_type: type[Page[T]] = Page[schema]  # type: ignore[valid-type]
    return page_type(
        items=[to_item(row) for row in rows[: page.limit]],
        limit=page.limit,
        offset=page.offset,
        next_offset=next_offset,
    )


def page_of(items: Sequence[T], page: PageParams) -> Page[T]:
    """One page of a list computed in memory (not a query), in the same shape."""
    chunk = list(items[page.offset : page.offset + page.limit])
    more = page.offset + page.limit < len(items)
    return Page[T](
        items=chunk,
        limit=page.limit,
        offset=page.offset,
        next_offset=page.offset + page.limit if more else None,
    )


S = TypeVar("S", bound=Select[Any])


def where_given(query: S, *filters: tuple[Any, object]) -> S:
    """``query`` narrowed to ``column == value`` for each (column, value) whose value was given
    (not None): a list endpoint's optional filters."""
    for column, value in filters:
        if value is not None:
            query = query.where(column == value)
    return query
