"""Without a usable GPU, `--backend auto` must fall back to the CPU with a one-line reason."""
from __future__ import annotations

import pytest

from memra_engine.gpu import available


def _have_gpu() -> bool:
    ok, _ = available()
    return ok


@pytest.mark.skipif(_have_gpu(), reason="a GPU is present: nothing to fall back from")
def test_available_says_no_with_a_reason():
    ok, reason = available()
    assert ok is False
    assert reason and "\n" not in reason and "CPU" in reason


@pytest.mark.skipif(_have_gpu(), reason="a GPU is present: nothing to fall back from")
def test_auto_backend_falls_back_to_cpu_with_a_notice():
    from memra_engine.backend_select import choose_backend

    notices = []
    assert choose_backend("auto", notices.append) == "cpu"
    assert len(notices) == 1 and "CPU" in notices[0]
