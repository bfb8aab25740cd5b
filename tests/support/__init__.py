"""Shared test machinery: real processes, real sockets, no mocks."""
