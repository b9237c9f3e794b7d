"""GPU providers: the real one (pynvml) and a simulator that stands in for it."""
