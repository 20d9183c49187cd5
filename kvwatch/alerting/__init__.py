"""Paging: decide (pure state machine) apart from deliver (Alertmanager v2 loop).

- :mod:`~kvwatch.alerting.policy` — which verdict raises which alert; fire/resolve counts.
- :mod:`~kvwatch.alerting.state` — ``evaluate(states, event, policy, now)`` -> changed states.
- :mod:`~kvwatch.alerting.alertmanager` — settings, HTTP client, the postable-alert format.
- :mod:`~kvwatch.alerting.delivery` — ``Delivery``: reads stored states, sends what is due.
"""
