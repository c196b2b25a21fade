"""Helpers the tests share (tests/support/common.py: places, topologies, ports; the rest by subject)."""
