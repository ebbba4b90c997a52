"""Traces: schema, loading with one-line errors, converters from public formats, builders of bundled traces."""
from sim.infra.errors import TraceError
from sim.core.trace.loader import load_trace
from sim.core.trace.schema import Request, Trace

__all__ = ["Request", "Trace", "load_trace", "TraceError"]
