"""The four dashboards' content, one module each: which panels, over which queries (``build()``)."""
