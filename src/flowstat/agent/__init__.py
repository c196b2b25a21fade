"""flowstat's Python agent: samples pipeline nodes from /proc and their control channels.

``flowstat agent --help`` for the command; the sample schema (flowstat.schema) for what it records.
"""

AGENT_NAME = "flowstat-agent-py"
