"""The harness's devices; each runs as its own OS process (``flowstat device ROLE``)."""
