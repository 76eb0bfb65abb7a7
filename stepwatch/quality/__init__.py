"""Detection quality: seeded scenario suites scored against their ground truth.

Used by ``stepwatch bench detect`` and ``bench/detect_quality.py``; lives in the
package (not in ``bench/``) so an installed copy can run it too.
"""
