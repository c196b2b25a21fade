"""Monitor your own pipeline: flowstat's control channel for any ZeroMQ process (flowstat.node.Node),
the protocol's client (ControlClient) and its pieces, shared with flowstat's harness nodes.
See docs/node-library.md."""

from .node import STATES, Node, Tally
from .protocol import ControlClient, ControlError

__all__ = ["STATES", "ControlClient", "ControlError", "Node", "Tally"]
