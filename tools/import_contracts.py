"""A custom import-linter contract: no package imports another package's ``repository``.

Each table has one owning package, which alone queries and writes it through its
``repository`` module. Other packages go through the owner's service or its documented read
interface (a ``reads`` or ``visibility`` module, or an entry of ``read_interfaces``: the README
lists them), never through the repository itself.
"""

from __future__ import annotations

from typing import Any

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


class OwnRepositoryContract(Contract):
    """Options: ``containers`` (packages whose subpackages are the domain packages) and
    ``read_interfaces`` (``"importer -> owner.repository"`` pairs allowed on purpose; an
    importer names a package or module and covers what is inside it)."""

    type_name = "own repository"

    containers = fields.ListField(subfield=fields.StringField())
    read_interfaces = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        pairs: list[str] = self.read_interfaces  # type: ignore[assignment]  # parsed by then
        containers: list[str] = self.containers  # type: ignore[assignment]
        allowed = [tuple(part.strip() for part in pair.split("->")) for pair in pairs]
        violations: list[dict[str, Any]] = []
        used: set[tuple[str, ...]] = set()
        for container in containers:
            for repository in sorted(_repositories(graph, container)):
                owner = repository.rsplit(".", 1)[0]
                for importer in sorted(graph.find_modules_that_directly_import(repository)):
                    if importer == owner or importer.startswith(owner + "."):
                        continue
                    pair = next((p for p in allowed if _covers(p, importer, repository)), None)
                    if pair is not None:
                        used.add(pair)
                        continue
                    lines = graph.get_import_details(importer=importer, imported=repository)
                    violations.append(
                        {
                            "importer": importer,
                            "imported": repository,
                            "lines": [d["line_number"] for d in lines],
                        }
                    )
        unused = [" -> ".join(p) for p in allowed if p not in used]
        return ContractCheck(
            kept=not violations and not unused,
            metadata={"violations": violations, "unused": unused},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for v in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in v["lines"])
            output.print_error(f"{v['importer']} imports {v['imported']} ({lines})", bold=False)
            output.new_line()
        for pair in check.metadata["unused"]:
            output.print_error(f"read_interfaces entry matches no import: {pair}", bold=False)
            output.new_line()


def _repositories(graph: ImportGraph, container: str) -> set[str]:
    return {
        module
        for module in graph.find_descendants(container)
        if module.count(".") == container.count(".") + 2 and module.endswith(".repository")
    }


def _covers(pair: tuple[str, ...], importer: str, repository: str) -> bool:
    source, target = pair
    return target == repository and (importer == source or importer.startswith(source + "."))
