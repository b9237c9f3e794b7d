"""The agent deploys alone on GPU nodes: it must not import the service or its dependencies."""

import subprocess
import sys

from tests.metering_agent.agent_helpers import REPO

CHECK = """
import sys
import metering_agent.cli, metering_agent.nvml.real
bad = sorted({m.split('.')[0] for m in sys.modules} & {'app', 'fastapi', 'sqlalchemy', 'pydantic',
    'httpx', 'stripe', 'pynvml'})
print(','.join(bad))
"""


def test_agent_imports_neither_the_service_nor_pynvml_eagerly() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""
