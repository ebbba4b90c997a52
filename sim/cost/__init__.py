"""Step-cost models: analytic roofline and profiled tables behind one interface."""
