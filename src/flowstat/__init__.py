"""flowstat: monitoring and observability for streaming data-processing pipelines."""

__version__ = "0.1.0"
