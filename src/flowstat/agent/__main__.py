"""``python -m flowstat.agent``: the Python agent, as ``flowstat agent`` (how flowstat run starts it)."""

import argparse
import sys

from flowstat import stores

from .command import PARSER, configure, main

# the same --help as flowstat agent's
parser = argparse.ArgumentParser(
    prog="flowstat agent",
    formatter_class=argparse.RawDescriptionHelpFormatter,
    description=str(PARSER["description"]),
    epilog=str(PARSER["epilog"]),
)
configure(parser)
args = parser.parse_args()
try:
    stores.use_credentials_file(args.credentials)
except stores.CredentialsError as exc:
    print(f"flowstat agent: {exc}", file=sys.stderr)
    sys.exit(2)
sys.exit(main(args))
