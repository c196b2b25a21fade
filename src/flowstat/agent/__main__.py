"""``python -m flowstat.agent``: the Python agent, as ``flowstat agent`` (how flowstat run starts it)."""

import argparse
import sys

from .command import configure, main

parser = argparse.ArgumentParser(prog="flowstat agent")
configure(parser)
sys.exit(main(parser.parse_args()))
