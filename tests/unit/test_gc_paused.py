"""analysis.gc_paused (used by load_store and the report) leaves the garbage collector as it found it."""
import gc

import pytest

from specab.analysis.evidence.model import gc_paused


def test_gc_is_paused_inside_and_restored_after_even_on_error():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_caller_that_disabled_gc_keeps_it_disabled():
    gc.disable()
    try:
        with gc_paused():
            with gc_paused():           # nested (load_store inside the report)
                pass
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
