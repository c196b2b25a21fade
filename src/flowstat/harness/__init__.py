"""The flowstat load harness: producers, mergers and a viewer over ZeroMQ push-pull.

A modern version of the 2016 ALICE O2 Quality Control merger prototype (see docs/harness.md).
"""
