"""``flowstat report``: runs looked at offline, in one self-contained HTML file.

Per run: its parameters, the no-loss and online verdicts (run.json), which alert conditions held
and when, and every numeric metric of the sample schema per node over time, grouped by role
(Bokeh: zoom, pan, hover). For all runs together, the thesis-style table of the steady state, one
row per run, and, for several runs, their merged objects/s against what differs between them.
docs/report.md says how each figure is defined.

Kept light: ``flowstat`` imports the command (report.command) at every start, and Bokeh only
loads when a report is written (report.build.write_report).
"""
