"""Initialize-era (legacy) backends behind the modern front: sessions, translation, MRTR.

Everything specific to the legacy protocol lives in this package (DESIGN.md principle 5), so
dropping the era is deleting it. See docs/legacy.md.
"""
