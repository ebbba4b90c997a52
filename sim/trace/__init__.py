"""Traces: schema, loading with one-line errors, converters from public formats, builders of bundled traces."""
from sim.errors import TraceError
from sim.trace.loader import load_trace
from sim.trace.schema import Request, Trace

__all__ = ["Request", "Trace", "load_trace", "TraceError"]
