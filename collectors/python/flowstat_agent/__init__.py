"""flowstat's Python agent: samples pipeline nodes from /proc and their control channels.

``flowstat agent --help`` for the command; ``collectors/schema/sample.schema.json`` for the sample.
"""

AGENT_NAME = "flowstat-agent-py"
