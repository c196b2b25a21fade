"""flowstat's Python agent: samples pipeline nodes from /proc and their control channels.

``flowstat agent --help`` for the command; the sample schema (flowstat.schema.sample) for what it records.
"""

AGENT_NAME = "flowstat-agent-py"
