"""Helpers the tests share (fakes, synthetic data, schema checks, paths); no tests here."""
