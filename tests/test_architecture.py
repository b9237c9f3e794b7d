"""The import contracts in pyproject.toml hold, and each one catches the import it forbids;
services read no settings; docs/reactions.md is the wiring.

`lint-imports` runs on a copy of the source tree with one forbidden import per contract (and,
for table ownership, one cross-owner query of each shape it may take) added; every contract
must report BROKEN, naming the offending module.
"""

from __future__ import annotations

import ast
import inspect
import re
import shutil
import subprocess
import sys
import tomllib
from decimal import Decimal
from pathlib import Path

from sqlalchemy.orm import Session

from app import wiring
from app.balances.service import grant_trial_credit
from app.core.reactions import registrations, render
from app.customers.models import Customer
from app.customers.service import add_created_hook
from app.events.service import subscribe
from app.settings import get_settings
from app.webhooks.service import on_event as deliver_to_webhooks

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# (module file, forbidden import appended to it, contract name as lint-imports prints it)
BAD_IMPORTS = [
    ("metering_agent/records.py", "import app.settings", "The agent deploys alone"),
    ("app/core/money.py", "import app.billing.core.lines", "app.core is infrastructure"),
    ("app/metering/segments.py", "import app.billing.core.domain", "Layers: each imports only"),
    ("app/rentals/service.py", "import app.fleet.repository", "A package's repository is private"),
    # Once a listed exception (the dashboard read billing's repository): none is left.
    (
        "app/dashboard/operators.py",
        "from app.billing.repository import voucher_entries",
        "A package's repository is private",
    ),
    ("app/billing/core/intervals.py", "import sqlalchemy", "The billing core is pure"),
]

# (module file, another package's table used in it, what lint-imports says it queries): each
# shape a query on another package's table may take, one module each.
FOREIGN_QUERIES = [
    # Its model, imported from its models module, and its table in SQL text.
    (
        "app/customers/service.py",
        "from app.billing.models import Invoice\nOPEN = select(Invoice.id)",
        "app.billing's Invoice",
    ),
    (
        "app/auth/service.py",
        'GPUS = text("SELECT count(*) FROM gpus")',
        "app.fleet's table gpus in SQL",
    ),
    # The models module under an alias, or reached by its dotted name.
    (
        "app/budgets/service.py",
        "from app.billing import models as billing_models\nX = select(billing_models.Invoice.id)",
        "app.billing's Invoice",
    ),
    (
        "app/webhooks/service.py",
        "import app.billing.models\nX = app.billing.models.Invoice.status",
        "app.billing's Invoice",
    ),
    # A model re-exported through the owner's service (which imports it for its own queries).
    (
        "app/dashboard/wording.py",
        "from app.billing.service import Invoice as Bill\nX = select(Bill)",
        "app.billing's Invoice",
    ),
    # SQL in lowercase, a table() construct, a schema-qualified and a quoted name.
    (
        "app/plans/service.py",
        'X = text("select count(*) from invoices")',
        "app.billing's table invoices in SQL",
    ),
    (
        "app/schedule/service.py",
        'X = select(table("invoices").c.id)',
        "app.billing's table invoices in table()",
    ),
    (
        "app/events/service.py",
        'X = text("DELETE FROM public.invoices")',
        "app.billing's table invoices in SQL",
    ),
    (
        "app/failover/pool.py",
        "X = text('UPDATE \"gpus\" SET pool = 1')",
        "app.fleet's table gpus in SQL",
    ),
]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120
    )


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_a_forbidden_import_breaks_its_contract(tmp_path: Path) -> None:
    for package in ("app", "metering_agent", "tools"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    tables = "Each table's package alone queries"
    planted = [*BAD_IMPORTS, *((module, code, tables) for module, code, _ in FOREIGN_QUERIES)]
    for module, bad_import, _ in planted:
        with (tmp_path / module).open("a") as source:
            source.write(f"\n{bad_import}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout
    summary = result.stdout.split("Broken contracts")[0]
    for module, bad_import, contract in planted:
        broken = [line for line in summary.splitlines() if line.startswith(contract)]
        assert broken, f"{contract!r} missing from:\n{summary}"
        importer = module.removesuffix(".py").replace("/", ".")
        assert importer in result.stdout, f"{bad_import} in {module} not reported"
    assert "app.customers.service (l." in result.stdout  # names the line, and what it queries
    assert "queries app.billing's Invoice" in result.stdout
    assert "queries app.fleet's table gpus in SQL" in result.stdout
    assert "app.dashboard.operators imports app.billing.repository (l." in result.stdout
    for module, code, what in FOREIGN_QUERIES:
        importer = module.removesuffix(".py").replace("/", ".")
        reported = [line for line in result.stdout.splitlines() if line.startswith(importer)]
        assert any(f"queries {what}" in line for line in reported), (
            f"{code} in {module}: {reported}"
        )
    assert "Contracts: 0 kept, 6 broken." in result.stdout


def test_the_architecture_page_pictures_the_layers_of_the_contract() -> None:
    """Each line of docs/architecture.md's layer picture (``a > b`` for layers in order,
    ``a : b`` and ``a | b`` for one layer) reads, top to bottom, as the contract's layers."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c["layers"] for c in contracts["contracts"] if c["type"] == "layers"]
    architecture = (REPO / "docs" / "architecture.md").read_text()
    picture = architecture.split("packages joined by `|` may not:")[1].split("```")[1]
    pictured = [
        layer.replace("app.", "").strip()
        for line in picture.splitlines()
        if line.strip().startswith("app.")
        for layer in re.split(r"\s{2,}", line.strip())[0].split(" > ")
    ]
    assert pictured == layers


# Who reads the settings (``get_settings``): the composition roots, which hand each service the
# values it follows, and infrastructure that no domain rule is about. Every ``endpoints.py``
# (the request's edge) and ``jobs.py`` (the worker's) may as well, though most take
# ``AppSettings`` or the worker's context instead.
SETTINGS_READERS = {
    "app/main.py": "composition root: the app, its middleware, ingest's writers",
    "app/wiring.py": "composition root: the subscribers, given their settings per event",
    "app/cli": "composition root: each command",
    "app/demo/run.py": "composition root: the demo's processes",
    "app/core/deps.py": "AppSettings, the endpoints' dependency",
    "app/core/db.py": "the engine and its pool",
    "app/core/limits.py": "ASGI middleware and the server protocol's header timeout",
    "app/core/crypto.py": "a column type (encrypted at rest): no call passes it a value",
    "app/auth/cache.py": "the process's key cache per engine, and how stale it may be",
    "app/dashboard/sessions.py": "the session cookie's signing key (middleware)",
    "app/settings.py": "the settings themselves: Settings, read by get_settings",
    "app/core/scratch_db.py": "the throwaway databases of tests and benchmarks: their server",
    # Commands run with the process's own environment (and SLURM_CONF); no setting is read.
    "app/slurm/scheduler.py": "the Slurm commands' environment",
    "app/demo/slurm_cluster.py": "the demo cluster's Slurm commands' environment",
}
EDGES = ("endpoints.py", "jobs.py")


def settings_readers(root: Path) -> list[str]:
    """The modules under ``root``/app that read settings: name ``get_settings`` (imported or
    called), construct ``Settings`` (or call one of its methods), or read the environment
    (``os.environ``, ``os.getenv``)."""
    return [
        path.relative_to(root).as_posix()
        for path in sorted((root / "app").rglob("*.py"))
        if _reads_settings(ast.parse(path.read_text(), str(path)))
    ]


ENVIRONMENT = {"environ", "getenv"}


def _reads_settings(tree: ast.Module) -> bool:
    imports = [
        (n.module, alias.name, alias.asname or alias.name)
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        for alias in n.names
    ]
    os_modules = {
        alias.asname or alias.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
        for alias in n.names
        if alias.name == "os"
    }
    settings_class = {"Settings"} | {local for _, name, local in imports if name == "Settings"}
    environment = {local for module, name, local in imports if (module, name) in _OS_ENVIRONMENT}
    if any(name == "get_settings" for _, name, _ in imports):
        return True
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if name == "get_settings" or (isinstance(node, ast.Name) and node.id in environment):
            return True
        if isinstance(node, ast.Call) and _callee(node.func) in settings_class:
            return True  # Settings(), app.settings.Settings(), Settings.model_validate(...)
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ENVIRONMENT
            and isinstance(node.value, ast.Name)
            and node.value.id in os_modules
        ):
            return True  # os.environ, os.getenv
    return False


_OS_ENVIRONMENT = {("os", name) for name in ENVIRONMENT}


def _callee(func: ast.expr) -> str | None:
    """The class a call constructs or whose method it calls, by name: ``Settings`` in
    ``Settings()``, ``settings.Settings()`` and ``Settings.model_validate()``."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        if func.attr == "Settings":
            return func.attr
        if isinstance(func.value, ast.Name):
            return func.value.id
    return None


def _allowed(module: str) -> bool:
    return module.endswith(EDGES) or any(
        module == allowed or module.startswith(f"{allowed}/") for allowed in SETTINGS_READERS
    )


def test_services_read_no_settings_only_their_composition_roots_do() -> None:
    readers = settings_readers(REPO)
    assert [m for m in readers if not _allowed(m)] == []
    # Each allowance is still needed: a module that stopped reading settings leaves the list.
    assert [a for a in SETTINGS_READERS if not any(m.startswith(a) for m in readers)] == []


def test_a_service_reading_settings_is_caught(tmp_path: Path) -> None:
    planted = {
        "app/budgets/service.py": "from app.settings import get_settings\n",
        "app/billing/usage.py": "import app.settings\nX = app.settings.get_settings()\n",
        "app/fleet/endpoints.py": "from app.settings import get_settings\n",  # an edge
        # The settings constructed, not asked for by name.
        "app/plans/service.py": "from app.settings import Settings\nX = Settings().trial_credit\n",
        "app/rentals/service.py": "import app.settings\nX = app.settings.Settings()\n",
        "app/payments/service.py": "from app.settings import Settings as S\nX = S.model_copy(s)\n",
        # The environment read beside them.
        "app/webhooks/service.py": "import os\nX = os.environ['GPUMETER_STRIPE_API_KEY']\n",
        "app/schedule/service.py": "import os as system\nX = system.getenv('TZ')\n",
        "app/events/service.py": "from os import environ\nX = environ.get('GPUMETER_NATS_URL')\n",
        # Neither: a value named like a setting, a method on another settings object.
        "app/customers/service.py": "def f(settings):\n    return settings.environ, settings.x()\n",
    }
    for module, source in planted.items():
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(source)
    readers = settings_readers(tmp_path)
    assert readers == [
        "app/billing/usage.py",
        "app/budgets/service.py",
        "app/events/service.py",
        "app/fleet/endpoints.py",
        "app/payments/service.py",
        "app/plans/service.py",
        "app/rentals/service.py",
        "app/schedule/service.py",
        "app/webhooks/service.py",
    ]
    assert [m for m in readers if not _allowed(m)] == [
        "app/billing/usage.py",
        "app/budgets/service.py",
        "app/events/service.py",
        "app/payments/service.py",
        "app/plans/service.py",
        "app/rentals/service.py",
        "app/schedule/service.py",
        "app/webhooks/service.py",
    ]


# --- who reacts to what (docs/reactions.md) ---------------------------------------------------

# A subscriber list's or hook list's registrar, by the names the packages give them.
REGISTRAR = re.compile(r"^(subscribe|add_\w+_(check|hook))$")


def test_the_reactions_table_is_the_wiring() -> None:
    """docs/reactions.md is what ``app.wiring`` registers; after a change to the wiring (or to
    a handler's docstring), regenerate it with the command the page names."""
    assert (REPO / "docs" / "reactions.md").read_text() == wiring.reactions_table(), (
        f"docs/reactions.md is stale: {wiring.REACTIONS_COMMAND}"
    )


def test_every_registrar_the_wiring_calls_has_a_trigger() -> None:
    """A registrar missing from ``TRIGGERS`` would leave its handlers out of the table."""
    calls = (n for n in ast.walk(ast.parse(inspect.getsource(wiring.install))))
    called = {n.func.id for n in calls if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {name for name in called if REGISTRAR.match(name)} <= set(wiring.TRIGGERS)


def _planted_install() -> None:
    """A wiring a newcomer might write (never called: only read): a subscriber that queues a
    job, and a hook under a setting."""
    subscribe("invoice.paid", deliver_to_webhooks)
    if get_settings().trial_credit:
        add_created_hook(_welcome)


def _welcome(session: Session, customer: Customer) -> None:
    grant_trial_credit(session, customer, Decimal("5.00"))  # a wrapper: the table names its callee


def test_a_planted_registration_reaches_the_table() -> None:
    registered = registrations(_planted_install, wiring.TRIGGERS, wiring.BLUEPRINTS)
    assert [(r.trigger, r.handler, r.condition, r.jobs) for r in registered] == [
        ("`invoice.paid` is published", deliver_to_webhooks, None, ("webhooks:deliver",)),
        (
            "a customer is created",
            grant_trial_credit,
            "get_settings().trial_credit",
            (),
        ),
    ]
    table = render(registered, [], "planted")
    assert "| `invoice.paid` is published | `app.webhooks.service.on_event` |" in table
    assert "only if `get_settings().trial_credit`" in table


def registrations_outside_wiring(root: Path) -> list[str]:
    """Modules under ``root``/app, but ``app/wiring.py``, that call a registrar: a subscriber or
    hook registered there would be missing from the table."""
    found = []
    for path in sorted((root / "app").rglob("*.py")):
        if path.relative_to(root).as_posix() == "app/wiring.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name and REGISTRAR.match(name):
                    found.append(path.relative_to(root).as_posix())
                    break
    return found


def test_only_the_wiring_registers_reactions(tmp_path: Path) -> None:
    assert registrations_outside_wiring(REPO) == []
    # Each registrar the wiring calls is one the table reads.
    called = {
        n.func.id
        for n in ast.walk(ast.parse(inspect.getsource(wiring.install)))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and REGISTRAR.match(n.func.id)
    }
    assert called == set(wiring.TRIGGERS)
    planted = {
        "app/budgets/service.py": "from app.events import service\nservice.subscribe('a.b', f)\n",
        "app/rentals/endpoints.py": "add_create_check(print)\n",
    }
    for module, source in planted.items():
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(source)
    assert registrations_outside_wiring(tmp_path) == [
        "app/budgets/service.py",
        "app/rentals/endpoints.py",
    ]
