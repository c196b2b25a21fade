"""``flowstat report``: runs looked at offline, in one self-contained HTML file.

First, per run, the verdicts, the pipeline graph (graph.py: who feeds whom, where each node's time
went) and key figures (glance.py); for several runs, the thesis-style table of the steady state and
merged objects/s against a parameter only for runs that differ in it alone; per run, its
parameters, the no-loss and online verdicts (run.json), which alert conditions held and when, and
per role the Run view's panels over time (flowstat.views: the dashboards' definitions; labels and
human units from flowstat.views.labels), constants and other fields as tables (Bokeh: zoom, pan,
hover). docs/report.md says how each figure is defined.

Kept light: ``flowstat`` imports the command (report.command) at every start, and Bokeh only
loads when a report is written (report.build.write_report).
"""
