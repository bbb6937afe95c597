"""The upstream kit: patches exported, proven and linted as upstream pull requests."""
