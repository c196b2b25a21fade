"""docs/thesis-comparison-tables.md and its plots come from committed data (the thesis's numbers, the
campaigns' results). That they are current is test_generated's check; here: every table has its plot."""

from __future__ import annotations

from flowstat.campaign import thesis
from support.common import ROOT


def test_the_comparison_draws_one_plot_per_thesis_table_it_compares():
    made = thesis.render(ROOT)
    docs = [p for p in made if p.suffix == ".md"]
    plots = [p for p in made if p.suffix == ".svg"]
    assert [p.name for p in docs] == ["thesis-comparison-tables.md"]
    assert len(plots) == 18
    text = made[docs[0]]
    for plot in plots:
        assert plot.name in text, f"{plot.name} is drawn but the comparison does not show it"
