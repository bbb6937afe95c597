"""The fork as a pip-installable wheel, and the plugin that says which series runs."""
