"""Initialize-era (legacy) backends behind the modern front: sessions, translation, MRTR.

Everything specific to the legacy protocol lives in this package (DESIGN.md principle 5), and
nothing outside it imports it but two marked lines of `gateway/backends/__init__.py` (the
rows of `wiring.py`), so dropping the era is deleting it and those lines. What both eras use
(the era probe, the stdio supervisor, `Exchange`, the HTTP client, the error map) lives in
`gateway/backends/`. See docs/legacy.md and docs/backends.md.
"""
