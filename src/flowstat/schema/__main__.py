"""``python -m flowstat.schema``: print the schemas' documentation (docs/schema.md ends with it:
`make generate` writes it there)."""

from . import markdown_tables

print(markdown_tables(), end="")
