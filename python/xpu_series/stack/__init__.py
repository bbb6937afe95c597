"""The patch stack on its pin: wheel, trees, series, headers, engine, operations."""
