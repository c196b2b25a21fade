"""Processes as Linux shows them in /proc: memory, CPU, liveness, descendants (procfs), and the
cheap repeated reader the agents' sampling is built on (reader)."""
