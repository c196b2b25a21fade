"""Where the inbox forwards each alert: a webhook (the alert as JSON) and e-mail through an SMTP
server, as the environment (the compose stack's .env) says. Each destination has a thread and a
queue of its own: a slow or dead one never holds the inbox nor the other. A failed delivery is
retried with backoff for RETRY_FOR_S, then given up and said once; the alert stays in the inbox's
log either way."""

from __future__ import annotations

import json
import logging
import queue
import smtplib
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage

import requests

from .received import ReceivedAlert

log = logging.getLogger("flowstat.inbox")
RETRY_FOR_S = 300.0
FIRST_RETRY_S = 2.0


class RelayError(ValueError):
    """A relay the environment asks for but cannot describe (a bad port, an address missing)."""


@dataclass(frozen=True)
class Webhook:
    url: str

    name = "webhook"

    def send(self, alert: ReceivedAlert) -> None:
        resp = requests.post(
            self.url, data=json.dumps(alert.as_dict()), timeout=10, headers={"Content-Type": "application/json"}
        )
        if resp.status_code >= 300:
            raise OSError(f"HTTP {resp.status_code}")

    def where(self) -> str:
        return self.url.split("?")[0]  # a query may hold a token


@dataclass(frozen=True)
class Email:
    host: str
    port: int
    sender: str
    to: tuple[str, ...]
    user: str | None = None
    password: str | None = None
    starttls: bool = False

    name = "email"

    def message(self, alert: ReceivedAlert) -> EmailMessage:
        msg = EmailMessage()
        state = "" if alert.status == "firing" else f" ({alert.status})"
        msg["Subject"] = f"flowstat: {alert.rule}{state}: {alert.node_id or alert.agent} of run {alert.run_id}"
        msg["From"], msg["To"] = self.sender, ", ".join(self.to)
        body = [alert.summary, ""] + [f"{k}: {v}" for k, v in alert.as_dict().items() if v and k != "summary"]
        msg.set_content("\n".join(body) + "\n")
        return msg

    def send(self, alert: ReceivedAlert) -> None:
        with smtplib.SMTP(self.host, self.port, timeout=15) as smtp:
            if self.starttls:
                smtp.starttls(context=ssl.create_default_context())
            if self.user:
                smtp.login(self.user, self.password or "")
            smtp.send_message(self.message(alert))

    def where(self) -> str:
        return f"{', '.join(self.to)} through {self.host}:{self.port}"


def from_environment(env: Mapping[str, str]) -> list[Webhook | Email]:
    """The relays the environment names: FLOWSTAT_RELAY_WEBHOOK; FLOWSTAT_RELAY_EMAIL_TO with
    FLOWSTAT_SMTP_HOST (and _PORT, _USER, _PASSWORD, _FROM, _STARTTLS)."""
    out: list[Webhook | Email] = []
    if env.get("FLOWSTAT_RELAY_WEBHOOK"):
        out.append(Webhook(env["FLOWSTAT_RELAY_WEBHOOK"]))
    to = tuple(a.strip() for a in env.get("FLOWSTAT_RELAY_EMAIL_TO", "").split(",") if a.strip())
    if to:
        host = env.get("FLOWSTAT_SMTP_HOST")
        if not host:
            raise RelayError("FLOWSTAT_RELAY_EMAIL_TO is set: FLOWSTAT_SMTP_HOST must say which SMTP server sends")
        try:
            port = int(env.get("FLOWSTAT_SMTP_PORT") or 25)
        except ValueError:
            raise RelayError(f"FLOWSTAT_SMTP_PORT: not a port number: {env['FLOWSTAT_SMTP_PORT']!r}") from None
        out.append(
            Email(
                host,
                port,
                env.get("FLOWSTAT_SMTP_FROM") or "flowstat@localhost",
                to,
                env.get("FLOWSTAT_SMTP_USER") or None,
                env.get("FLOWSTAT_SMTP_PASSWORD") or None,
                env.get("FLOWSTAT_SMTP_STARTTLS", "").lower() in ("1", "true", "yes"),
            )
        )
    return out


class Relay(threading.Thread):
    """Delivers alerts to one destination, in order, retrying each for RETRY_FOR_S."""

    def __init__(self, target: Webhook | Email, retry_for_s: float = RETRY_FOR_S):
        super().__init__(daemon=True, name=f"relay-{target.name}")
        self.target, self.retry_for_s = target, retry_for_s
        self.queue: queue.Queue[ReceivedAlert | None] = queue.Queue()
        self.sent = self.given_up = 0

    def submit(self, alert: ReceivedAlert) -> None:
        self.queue.put(alert)

    def stop(self) -> None:
        self.queue.put(None)

    def deliver(self, alert: ReceivedAlert) -> bool:
        deadline, delay, failing = time.monotonic() + self.retry_for_s, min(FIRST_RETRY_S, self.retry_for_s / 4), None
        while True:
            try:
                self.target.send(alert)
            except (OSError, requests.RequestException, smtplib.SMTPException) as exc:
                if failing is None:
                    log.error(
                        "relay to %s %s failed (%s): retrying for %.0f s",
                        self.target.name,
                        self.target.where(),
                        exc,
                        self.retry_for_s,
                    )
                failing = exc
                if time.monotonic() + delay > deadline:
                    log.error(
                        "relay to %s %s: gave up on an alert of %s (%s)",
                        self.target.name,
                        self.target.where(),
                        alert.rule,
                        failing,
                    )
                    return False
                time.sleep(delay)  # backoff between retries of a destination that failed
                delay = min(delay * 2, 60.0)
                continue
            if failing is not None:
                log.warning("relay to %s %s works again", self.target.name, self.target.where())
            return True

    def run(self) -> None:
        while (alert := self.queue.get()) is not None:
            if self.deliver(alert):
                self.sent += 1
            else:
                self.given_up += 1
