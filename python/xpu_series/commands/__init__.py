"""One module per verb; each returns a result object and never prints."""
