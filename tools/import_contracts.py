"""Custom import-linter contracts: no package imports another package's ``repository`` (nor
queries its tables), and a pure core imports only what it is allowed.

Each table has one owning package, which alone queries and writes it through its
``repository`` module. Other packages go through the owner's service or its one public read
surface, its ``reads`` module; the repository itself is private, with no exceptions.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


class OwnRepositoryContract(Contract):
    """Options: ``containers`` (packages whose subpackages are the domain packages). A
    package's ``repository`` may be imported only from inside that package: no exceptions."""

    type_name = "own repository"

    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        containers: list[str] = self.containers  # type: ignore[assignment]  # parsed by then
        violations: list[dict[str, Any]] = []
        for container in containers:
            for repository in sorted(_repositories(graph, container)):
                owner = repository.rsplit(".", 1)[0]
                for importer in sorted(graph.find_modules_that_directly_import(repository)):
                    if importer == owner or importer.startswith(owner + "."):
                        continue
                    lines = graph.get_import_details(importer=importer, imported=repository)
                    violations.append(
                        {
                            "importer": importer,
                            "imported": repository,
                            "lines": [d["line_number"] for d in lines],
                        }
                    )
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for v in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in v["lines"])
            output.print_error(f"{v['importer']} imports {v['imported']} ({lines})", bold=False)
            output.new_line()


def _repositories(graph: ImportGraph, container: str) -> set[str]:
    return {
        module
        for module in graph.find_descendants(container)
        if module.count(".") == container.count(".") + 2 and module.endswith(".repository")
    }


class OnlyImportsContract(Contract):
    """A package that imports nothing but the standard library and the modules listed.

    Options: ``source_modules`` (packages held to it) and ``allowed_modules`` (each covers the
    modules inside it). Everything the sources reach counts, directly or through another
    module, so an allowed module cannot bring in what the sources may not import themselves.
    Needs ``include_external_packages``: a third-party package is a module like any other.
    """

    type_name = "only imports"

    source_modules = fields.ListField(subfield=fields.StringField())
    allowed_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources: list[str] = self.source_modules  # type: ignore[assignment]  # parsed by then
        allowed: list[str] = self.allowed_modules  # type: ignore[assignment]
        violations: list[dict[str, Any]] = []
        reached = sorted({m for s in sources for m in {s} | graph.find_descendants(s)})
        seen = set(reached)
        for module in reached:  # grows with the allowed modules the sources reach
            for imported in sorted(graph.find_modules_directly_imported_by(module)):
                if imported.split(".")[0] in sys.stdlib_module_names or imported in seen:
                    continue
                if any(imported == a or imported.startswith(a + ".") for a in allowed):
                    seen.add(imported)
                    reached.append(imported)
                    continue
                lines = graph.get_import_details(importer=module, imported=imported)
                violations.append(
                    {
                        "importer": module,
                        "imported": imported,
                        "lines": [d["line_number"] for d in lines],
                    }
                )
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for v in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in v["lines"])
            output.print_error(f"{v['importer']} imports {v['imported']} ({lines})", bold=False)
            output.new_line()


# Calls that take a mapped class to query or write its table (``select(Invoice)``,
# ``session.get(Customer, id)``, ``.join(Gpu, ...)``); constructing the class writes it too.
_QUERY_CALLS = frozenset(
    {
        "select",
        "insert",
        "update",
        "delete",
        "get",
        "get_one",
        "join",
        "outerjoin",
        "join_from",
        "select_from",
        "aliased",
        "exists",
        "query",
        "with_entities",
    }
)
# A table named in SQL text, schema-qualified or not, quoted or not (public."invoices"). The
# keywords count in capitals anywhere, and in any case in a string that is an SQL statement
# (it begins with one), so prose in a message ("moved from gpus") does not count.
_IDENTIFIER = r'"?[A-Za-z_][A-Za-z0-9_]*"?'
_AFTER_KEYWORD = rf"\s+(?:ONLY\s+)?(?:{_IDENTIFIER}\s*\.\s*)?({_IDENTIFIER})"
_SQL_TABLE = re.compile(rf"\b(?:FROM|JOIN|INTO|UPDATE|TABLE){_AFTER_KEYWORD}")
_SQL_TABLE_ANY_CASE = re.compile(rf"\b(?:from|join|into|update|table){_AFTER_KEYWORD}", re.I)
_SQL_STATEMENT = re.compile(
    r"\s*(?:select|insert|update|delete|with|copy|lock|truncate|merge)\b", re.I
)
# Calls that name a table by its name: ``table("invoices")``, ``Table("invoices", metadata)``.
_TABLE_CALLS = frozenset({"table", "Table"})


@dataclass(frozen=True)
class _Tables:
    """Who owns what: mapped class names and table names per package."""

    classes: dict[str, frozenset[str]]
    names: dict[str, str]  # table name -> owning package


class OwnTablesContract(Contract):
    """A module queries and writes only its own package's tables.

    Options: ``containers`` (as above) and ``exempt`` (modules that name every table on
    purpose: the metadata for Alembic). A package's tables are the classes with a
    ``__tablename__`` in its ``models`` module. Broken by, outside the owner: a mapped class
    used in a query (``Invoice.status``, ``select(Invoice)``, ``session.get(Invoice, ...)``,
    ``Invoice(...)``), however it was imported (from ``models`` or a module of the owner that
    re-exports it, under an alias, or through an imported module: ``billing_models.Invoice``);
    its table named in SQL text (schema-qualified or quoted, and in lowercase in a string that
    is an SQL statement), or in ``table("invoices")``. Taking an instance the owner's service
    returned, or the class as a type hint, is fine.
    """

    type_name = "own tables"

    containers = fields.ListField(subfield=fields.StringField())
    exempt = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        containers: list[str] = self.containers  # type: ignore[assignment]  # parsed by then
        exempt: list[str] = self.exempt  # type: ignore[assignment]
        violations: list[dict[str, Any]] = []
        for container in containers:
            root = _source_root(container)
            modules = sorted(graph.find_descendants(container) - set(exempt))
            tables = _tables(root, container, graph)
            for module in modules:
                tree = ast.parse(_source_path(root, container, module).read_text())
                owner = ".".join(module.split(".")[: container.count(".") + 2])
                for line, what in _foreign_queries(tree, module, owner, tables):
                    violations.append({"module": module, "line": line, "what": what})
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for v in check.metadata["violations"]:
            output.print_error(f"{v['module']} (l.{v['line']}) queries {v['what']}", bold=False)
            output.new_line()


def _source_root(container: str) -> Path:
    spec = importlib.util.find_spec(container)
    assert spec is not None and spec.submodule_search_locations, container
    return Path(next(iter(spec.submodule_search_locations)))


def _source_path(root: Path, container: str, module: str) -> Path:
    parts = module.split(".")[container.count(".") + 1 :]
    path = root.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _tables(root: Path, container: str, graph: ImportGraph) -> _Tables:
    classes: dict[str, frozenset[str]] = {}
    names: dict[str, str] = {}
    for package in graph.find_children(container):
        models = package + ".models"
        if models not in graph.modules:
            continue
        tree = ast.parse(_source_path(root, container, models).read_text())
        mapped = {c.name: _tablename(c) for c in tree.body if isinstance(c, ast.ClassDef)}
        classes[package] = frozenset(name for name, table in mapped.items() if table)
        names.update({table: package for table in mapped.values() if table})
    return _Tables(classes, names)


def _tablename(cls: ast.ClassDef) -> str | None:
    for statement in cls.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target: ast.expr | None = statement.targets[0]
        elif isinstance(statement, ast.AnnAssign):
            target = statement.target
        else:
            continue
        value = statement.value
        if isinstance(target, ast.Name) and target.id == "__tablename__":
            return str(value.value) if isinstance(value, ast.Constant) else None
    return None


def _foreign_queries(
    tree: ast.Module, module: str, owner: str, tables: _Tables
) -> Iterator[tuple[int, str]]:
    """(line, what) for each use of another package's table, once per line."""
    foreign = _Foreign(_import_paths(tree, module), owner, tables)
    docstrings = _docstrings(tree)
    seen: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        for what in _uses(node, foreign, docstrings):
            line: int = node.lineno  # type: ignore[attr-defined]  # every node _uses yields for
            if (line, what) not in seen:
                seen.add((line, what))
                yield line, what


@dataclass(frozen=True)
class _Foreign:
    """What in one module stands for another package's mapped class or table."""

    paths: dict[str, str]  # local name -> the dotted path it was imported as
    owner: str
    tables: _Tables

    def cls(self, expr: ast.expr) -> str | None:
        """ "owner's Class" when ``expr`` is a mapped class of another package, however it was
        imported: from its ``models`` or a module that re-exports it (the owner's service),
        under an alias, or reached through an imported module (``billing_models.Invoice``)."""
        path = _dotted(expr, self.paths)
        if path is None or "." not in path:
            return None
        where, name = path.rsplit(".", 1)
        package = self._package_of(where)
        if package is None or name not in self.tables.classes[package]:
            return None
        return f"{package}'s {name}"

    def table(self, name: str) -> str | None:
        """ "owner's table name" when ``name`` (as written in SQL: quoted, any case) is
        another package's table."""
        table = name.strip('"').lower()
        package = self.tables.names.get(table, self.owner)
        return None if package == self.owner else f"{package}'s table {table}"

    def _package_of(self, module: str) -> str | None:
        for package in self.tables.classes:
            if package != self.owner and (module == package or module.startswith(package + ".")):
                return package
        return None


def _import_paths(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> dotted path, for every name an import binds (``import a.b`` binds ``a``)."""
    paths: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    paths[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    paths[root] = root
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module)
            for alias in node.names:
                paths[alias.asname or alias.name] = f"{source}.{alias.name}"
    return paths


def _absolute(node: ast.ImportFrom, module: str) -> str:
    """The module ``from ... import`` reads, relative imports (``from ..billing``) resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")[: -node.level]
    return ".".join([*base, *([node.module] if node.module else [])])


def _dotted(expr: ast.expr, paths: dict[str, str]) -> str | None:
    if isinstance(expr, ast.Name):
        return paths.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value, paths)
        return None if base is None else f"{base}.{expr.attr}"
    return None


def _uses(node: ast.AST, foreign: _Foreign, docstrings: set[int]) -> Iterator[str]:
    """What foreign table ``node`` queries, for each."""
    if isinstance(node, ast.Attribute):
        if what := foreign.cls(node.value):
            yield what  # Invoice.status, billing_models.Invoice.status
    elif isinstance(node, ast.Call):
        yield from _call_uses(node, foreign)
    elif isinstance(node, ast.JoinedStr):
        parts = (v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
        text = "".join(str(part) for part in parts)  # each {value} stands for a word
        yield from _sql_uses(text, foreign)
    elif (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ):
        yield from _sql_uses(node.value, foreign)


def _call_uses(node: ast.Call, foreign: _Foreign) -> Iterator[str]:
    if what := foreign.cls(node.func):
        yield what  # constructing the class writes its table
    callee = node.func.attr if isinstance(node.func, ast.Attribute) else None
    if isinstance(node.func, ast.Name):
        callee = node.func.id
    if callee in _QUERY_CALLS:
        yield from filter(None, (foreign.cls(arg) for arg in node.args))
    name = node.args[0] if callee in _TABLE_CALLS and node.args else None
    named = name.value if isinstance(name, ast.Constant) else None
    if isinstance(named, str) and (what := foreign.table(named.rsplit(".", 1)[-1])):
        yield f"{what} in {callee}()"


def _sql_uses(text: str, foreign: _Foreign) -> Iterator[str]:
    pattern = _SQL_TABLE_ANY_CASE if _SQL_STATEMENT.match(text) else _SQL_TABLE
    for name in pattern.findall(text):
        if what := foreign.table(name):
            yield f"{what} in SQL"


def _docstrings(tree: ast.Module) -> set[int]:
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, _SCOPES))]
    return {
        id(scope.body[0].value)
        for scope in scopes
        if scope.body
        and isinstance(scope.body[0], ast.Expr)
        and isinstance(scope.body[0].value, ast.Constant)
    }


_SCOPES = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
