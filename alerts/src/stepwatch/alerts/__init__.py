"""Alerts: Prometheus alert rules, Alertmanager routing and the remediator.

Rule and routing files live beside this package (``alerts/src/stepwatch/alerts/rules/``,
``alerts/src/stepwatch/alerts/alertmanager/``); the remediator service is
:mod:`stepwatch.alerts.remediate`. See ``docs/alerts.md`` and ``docs/runbooks.md``.
"""
