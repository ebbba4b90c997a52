"""Drafters: exact n-gram lookup, model drafter (synthetic profile or recorded), n-gram calibration."""
