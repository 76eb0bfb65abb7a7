"""Post-mortem reports from the historical store (``stepwatch report --job ID``)."""
