"""The registered tests against their committed record: which files a run
needs, and the pytest plugin that runs them so (`xpu_series.registered.plugin`)."""
