"""``flowstat top``: a live terminal view of a running pipeline, read from its agents' /metrics or
from the samples an agent writes (issue 46: which node holds the flow back?).

scrape: an agent's /metrics parsed into each node's latest sample; tail: a samples file followed
into the same; watch: the nodes' recent points, who feeds whom (the endpoints) and the verdict
(flowstat.flow); frame: one frame drawn from fixed inputs; command: the options, the scrape loop
and the terminal.
"""
