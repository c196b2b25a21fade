"""``python -m flowstat.schema``: print the schemas' documentation (docs/schema.md embeds it)."""

from . import agent, run, sample

print("## Sample\n\n" + sample.markdown_table() + "\n## Run\n\n" + run.markdown_table() + "\n## Agent\n\n"
      + agent.markdown_table(), end="")
