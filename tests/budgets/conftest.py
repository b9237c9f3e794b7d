from tests.dashboard.conftest import client, seeded  # noqa: F401  (the dashboard's seeded month)
