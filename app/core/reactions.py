"""The "who reacts to what" table (docs/reactions.md), read from the composition root's code.

Call sites show only ``publish(...)`` or a hook list's loop; which package reacts, and whether
its work is done in the caller's transaction or later by a job, is decided where the
subscribers and hooks are registered. ``registrations`` reads those registrations from the
registering function's source (each call of a registrar, with the ``if`` it sits under);
``queued_jobs`` follows a handler's calls through the service's modules to each
``app.core.queue.defer`` and names the job it queues. ``render`` writes the table.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import procrastinate

from app.core import queue

# How deep ``queued_jobs`` follows calls: a subscriber reaches its ``defer`` in three or four.
_MAX_DEPTH = 8


@dataclass(frozen=True)
class Reaction:
    trigger: str  # what sets it off, in words
    handler: Callable[..., Any]  # the function that reacts (a composition root's wrapper unwrapped)
    condition: str | None  # the source of the ``if`` the registration sits under, if any
    jobs: tuple[str, ...]  # the jobs it may queue, as the worker names them


@dataclass(frozen=True)
class Periodic:
    cron: str
    job: str
    task: procrastinate.tasks.Task[Any, Any, Any]


def registrations(
    install: Callable[[], None],
    triggers: Mapping[str, Callable[..., str]],
    blueprints: Mapping[str, procrastinate.Blueprint],
) -> list[Reaction]:
    """Each call in ``install`` of a registrar named in ``triggers`` (the handler its last
    argument; ``triggers[name](*other arguments)`` says what sets it off), in source order."""
    tree = _tree(install)
    scope = install.__globals__
    reactions = []
    for call, condition in _calls(tree.body, None):
        if not isinstance(call.func, ast.Name) or call.func.id not in triggers:
            continue
        name = call.func.id
        *args, registered = (_resolve(arg, scope) for arg in call.args)
        jobs = tuple(_job_name(task, blueprints) for task in queued_jobs(registered))
        reactions.append(Reaction(triggers[name](*args), _unwrapped(registered), condition, jobs))
    return reactions


def _tree(function: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef:
    [node] = ast.parse(textwrap.dedent(inspect.getsource(function))).body
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), function
    return node


def _calls(body: list[ast.stmt], condition: str | None) -> Iterator[tuple[ast.Call, str | None]]:
    for statement in body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            yield statement.value, condition
        elif isinstance(statement, ast.If):
            yield from _calls(statement.body, ast.unparse(statement.test))


def _resolve(expr: ast.expr, scope: Mapping[str, Any]) -> Any:
    """The object a constant, a name or a dotted name stands for in ``scope``; None when it
    is anything else (a call, a local variable)."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.Name):
        return scope.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _resolve(expr.value, scope)
        if isinstance(base, (types.ModuleType, type)):
            return getattr(base, expr.attr, None)
    return None


def _unwrapped(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A composition root's one-call wrapper (it hands the handler its settings) stands for
    the function it calls."""
    body = _tree(handler).body
    if len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call):
        called = _resolve(body[0].value.func, handler.__globals__)
        if isinstance(called, types.FunctionType):
            return called
    return handler


def queued_jobs(function: Callable[..., Any]) -> list[procrastinate.tasks.Task[Any, Any, Any]]:
    """The tasks ``function`` may queue with ``app.core.queue.defer``, following its calls of
    functions in ``app`` modules, in the order first met."""
    found: list[procrastinate.tasks.Task[Any, Any, Any]] = []
    _follow(function, found, set(), _MAX_DEPTH)
    return found


def _follow(
    function: Callable[..., Any],
    found: list[procrastinate.tasks.Task[Any, Any, Any]],
    seen: set[Callable[..., Any]],
    depth: int,
) -> None:
    if depth == 0 or function in seen:
        return
    seen.add(function)
    scope = function.__globals__
    for call in (n for n in ast.walk(_tree(function)) if isinstance(n, ast.Call)):
        callee = _resolve(call.func, scope)
        if callee is queue.defer and len(call.args) > 1:
            task = _resolve(call.args[1], scope)
            if isinstance(task, procrastinate.tasks.Task) and task not in found:
                found.append(task)
        elif isinstance(callee, types.FunctionType) and callee.__module__.startswith("app."):
            _follow(callee, found, seen, depth - 1)
        elif isinstance(callee, types.MethodType) and callee.__module__.startswith("app."):
            _follow(callee.__func__, found, seen, depth - 1)


def _job_name(
    task: procrastinate.tasks.Task[Any, Any, Any],
    blueprints: Mapping[str, procrastinate.Blueprint],
) -> str:
    """``namespace:task``, as the worker names it (the task's own name gains the namespace
    once the queue adds its blueprint, so it is not read from the task)."""
    for namespace, blueprint in blueprints.items():
        if any(t is task for t in blueprint.tasks.values()):
            return f"{namespace}:{task.name.rsplit(':', 1)[-1]}"
    raise LookupError(f"task {task.name} is on no blueprint the queue runs")


def periodic(blueprints: Mapping[str, procrastinate.Blueprint]) -> list[Periodic]:
    """The jobs the worker runs on a schedule, with the cron their decorator gives (its
    expression where it is read from the settings), by job name."""
    jobs = [
        Periodic(_cron(p.task.func, p.cron), _job_name(p.task, blueprints), p.task)
        for blueprint in blueprints.values()
        for p in blueprint.periodic_registry.periodic_tasks.values()
    ]
    return sorted(jobs, key=lambda p: p.job)


def _cron(function: Callable[..., Any], cron: str) -> str:
    decorators = _tree(function).decorator_list
    for decorator in decorators:
        if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "periodic":
            [expr] = [k.value for k in decorator.keywords if k.arg == "cron"]
            if any(isinstance(n, ast.Call) for n in ast.walk(expr)):
                return ast.unparse(expr)  # a setting: its value differs between deployments
    return cron


def render(reactions: list[Reaction], schedule: list[Periodic], generator: str) -> str:
    lines = [
        "# Who reacts to what",
        "",
        f"Generated by `{generator}` from `app/wiring.py`; a test fails when the two disagree.",
        "",
        "Every subscriber and hook runs in the transaction of the change that set it off (a",
        "refusal rolls the change back; what it writes commits with it). Work that must not",
        "hold that transaction up is queued as a job there, so the job exists exactly when the",
        "change commits, and the worker runs it afterwards. Handlers of one trigger run in the",
        "order of the table.",
        "",
        "| When | Who reacts | What it does | Jobs it may queue |",
        "|---|---|---|---|",
    ]
    for r in reactions:
        when = r.trigger if r.condition is None else f"{r.trigger}, only if `{r.condition}`"
        jobs = ", ".join(f"`{job}`" for job in r.jobs) or "none: all in the transaction"
        lines.append(f"| {when} | `{_qualified(r.handler)}` | {_summary(r.handler)} | {jobs} |")
    lines += [
        "",
        "## Jobs on a schedule",
        "",
        "| Job | Cron | What it does |",
        "|---|---|---|",
    ]
    lines += [f"| `{p.job}` | `{p.cron}` | {_summary(p.task.func)} |" for p in schedule]
    return "\n".join(lines) + "\n"


def _qualified(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def _summary(function: Callable[..., Any]) -> str:
    """The first sentence of the docstring, on one line."""
    doc = " ".join((inspect.getdoc(function) or "").split())
    first, dot, _ = doc.partition(". ")
    return (first + (dot.strip() or "")).replace("|", "\\|")
