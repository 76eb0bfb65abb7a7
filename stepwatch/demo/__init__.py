"""``stepwatch demo``: the whole pipeline on embedded defaults, on one machine."""
