"""What flowstat stores: the sample (one observation of one node by one agent), the run, and the
agents' self-samples.

The JSON Schema files beside this module are the one definition; everything else (both agents,
the stores' templates and rollups, replay, the dashboards) derives from them or is tested against
them. The sample's API is re-exported here (``from flowstat import schema;
schema.validate(sample)``); the run document's is ``flowstat.schema.run``, the self-sample's
``flowstat.schema.agent``.
"""

from .sample import (
    DEFAULT_ROLE,
    INT64_MAX,
    NODE_STATES,
    PIPELINE_ROLES,
    PY_TYPES,
    ROLES,
    SCHEMA_FILE,
    STATE_DOWN,
    STATE_STOPPED,
    STATE_UP,
    Field,
    Layout,
    document_id,
    fields,
    from_control_reply,
    layout,
    markdown_table,
    measurement,
    schema,
    time_ns,
    to_json,
    to_line_protocol,
    validate,
)



def markdown_tables() -> str:
    """The documentation of every schema, a table each (docs/schema.md ends with it)."""
    from . import agent, run, sample

    return ("## Sample\n\n" + sample.markdown_table() + "\n## Run\n\n" + run.markdown_table() + "\n## Agent\n\n"
            + agent.markdown_table())


__all__ = ["DEFAULT_ROLE", "INT64_MAX", "NODE_STATES", "PIPELINE_ROLES", "PY_TYPES", "ROLES", "SCHEMA_FILE",
           "STATE_DOWN", "STATE_STOPPED", "STATE_UP", "Field", "Layout", "document_id", "fields", "from_control_reply", "layout",
           "markdown_table", "markdown_tables", "measurement", "schema", "time_ns", "to_json", "to_line_protocol", "validate"]
