"""What flowstat stores and exchanges, one module per document, each beside its JSON Schema file:

- ``flowstat.schema.sample``: the sample, one observation of one node by one agent;
- ``flowstat.schema.run``: the run document, what a run was;
- ``flowstat.schema.agent``: an agent's self-sample, how the agent itself is doing;
- ``flowstat.schema.endpoints``: endpoints.json, the nodes a harness run tells its agents to watch;
- ``flowstat.schema.agent_config``: the agents' configuration file (/etc/flowstat/agent.toml);
- ``flowstat.schema.flow``: the verdict (which node holds a run's flow back) and the edge points
  (a run's topology, the objects per second on each edge) that ``flowstat verdict`` writes.

The JSON Schema files are the one definition; everything else (both agents, the stores' templates
and rollups, replay, the dashboards) derives from them or is tested against them. Import the
module you mean (``from flowstat.schema import sample as sample_schema``): the package itself
re-exports nothing, so that a name says which document it belongs to.
"""


def markdown_tables() -> str:
    """The documentation of every schema, a table each (docs/schema.md ends with it)."""
    from . import agent, agent_config, flow, run, sample

    return (
        "## Sample\n\n"
        + sample.markdown_table()
        + "\n## Run\n\n"
        + run.markdown_table()
        + "\n## Agent\n\n"
        + agent.markdown_table()
        + "\n## Agent configuration\n\n"
        + agent_config.markdown_table()
        + "\n## Verdict\n\n"
        + flow.markdown_table("verdict")
        + "\n## Edge\n\n"
        + flow.markdown_table("edge")
    )


__all__ = ["markdown_tables"]
