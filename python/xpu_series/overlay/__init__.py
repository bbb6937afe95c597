"""The overlay: the series written into an installed sglang, undoable byte for byte."""
