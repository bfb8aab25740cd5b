"""Routing: which backend answers a call, and how list answers from many are merged."""
