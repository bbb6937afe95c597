"""The audit: XPU bugs by kind in an sglang release, guarded, reached, triaged."""
