"""The behavioural matrix: the series on several releases, by text and by tests."""
