"""``flowstat inbox``: where the alerts of Grafana and ElastAlert2 arrive, are shown, logged and
forwarded (a webhook, e-mail): the compose stack's `alerts` service (docs/alerts.md)."""
