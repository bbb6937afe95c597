"""Each patch proven: fails without, passes with, and its mutants killed."""
