"""The collector's thresholds while a big customer is rated (``app.core.memory``)."""

import gc

from app.core.memory import rare_collections


def test_rating_collects_garbage_rarely_and_restores_the_thresholds_after() -> None:
    before = gc.get_threshold()
    with rare_collections():
        with rare_collections():  # an overlapping use in the same process
            assert gc.get_threshold() == rare_collections.THRESHOLD
        assert gc.get_threshold() == rare_collections.THRESHOLD
    assert gc.get_threshold() == before
