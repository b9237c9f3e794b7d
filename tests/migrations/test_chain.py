"""The revisions form one line, in the order migrations/README.md lists (no database needed)."""

from __future__ import annotations

import re
from pathlib import Path

from alembic.script import ScriptDirectory

from app.core.migrate import alembic_config

README = Path(__file__).resolve().parents[2] / "migrations" / "README.md"


def test_the_revisions_form_one_line_in_the_order_the_readme_lists() -> None:
    scripts = ScriptDirectory.from_config(alembic_config("postgresql://unused"))
    revisions = {script.revision: script for script in scripts.walk_revisions()}
    assert len(scripts.get_bases()) == 1
    assert len(scripts.get_heads()) == 1
    for script in revisions.values():
        assert not isinstance(script.down_revision, tuple | list), f"{script.revision} merges"
        assert len(script.nextrev) <= 1, f"{script.revision} branches into {script.nextrev}"
        assert not script.dependencies, f"{script.revision} depends on {script.dependencies}"
    oldest_first = [script.revision for script in reversed(list(scripts.walk_revisions()))]
    listed = re.findall(r"^\| (\w+) \| `(\w+)\.py` \|$", README.read_text(), re.MULTILINE)
    assert [revision for revision, _ in listed] == oldest_first
    for revision, file in listed:
        assert Path(revisions[revision].path).stem == file
