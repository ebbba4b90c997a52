"""hybridspec simulator: the single home of everything the simulator and the real engines share."""
