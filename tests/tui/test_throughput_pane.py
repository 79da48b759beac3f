"""The Throughput pane's history: one reply reads as a figure, not as a trend (a one-value
sparkline fills the pane as a solid block); two or more get the range and the sparkline."""
from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Sparkline, Static

from memra_tui.widgets.throughput import ThroughputPane

pytestmark = pytest.mark.anyio


class PaneApp(App):
    def compose(self) -> ComposeResult:
        yield ThroughputPane()


async def test_one_reply_is_a_figure_and_two_are_a_trend():
    app = PaneApp()
    async with app.run_test() as pilot:
        pane = app.query_one(ThroughputPane)
        label, spark = pane.query_one("#throughput-history-label", Static), pane.query_one(Sparkline)
        assert not label.display and not spark.display  # no replies yet
        pane.history = [1234.4]
        await pilot.pause()
        assert str(label.render()) == "last reply: 1,234 tok/s"
        assert label.display and not spark.display
        pane.history = [1234.4, 987.6]
        await pilot.pause()
        assert str(label.render()) == "last 2 replies: 988–1,234 tok/s"
        assert label.display and spark.display and spark.data == [1234.4, 987.6]
