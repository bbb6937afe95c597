"""The rebase: move the series to a newer upstream release in one transaction."""
