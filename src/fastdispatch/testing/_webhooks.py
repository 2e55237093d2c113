"""Telegram's side of a webhook, for :class:`FakeTelegramServer`.

Once a bot calls ``setWebhook(url=..., secret_token=..., max_connections=...)``,
Telegram stops answering ``getUpdates`` (409) and POSTs each update to the
URL instead, as JSON, with the ``X-Telegram-Bot-Api-Secret-Token`` header.
An update leaves Telegram's queue only when the bot answers it with a 2xx;
any other answer, a refused connection or a timeout makes Telegram try the
same update again later, backing off, and the updates of one chat are
delivered in order, one at a time (an update waits while an earlier one of
its chat is being delivered or waiting for its next try).  Updates of
different chats go in parallel, over at most ``max_connections`` (default
40) connections.  :class:`WebhookDelivery` does the same with the fake's
update queue, so a bot's webhook (``webhook_app``, ``run_webhook``) is
tested against real redelivery.

Knobs (attributes of ``server.webhooks``, settable at any time):
``backoff`` (seconds before the second try, default 0.1), doubling up to
``max_backoff`` (default 2.0) for later ones; ``timeout`` (seconds to wait
for the bot's answer, default 10).  Telegram's own figures are not
published (it retries for a while, then drops the update); the fake retries
for as long as the webhook is set, so a test sees every update answered.
The record: :meth:`WebhookDelivery.attempts` lists every try
(``WebhookAttempt(update_id, chat, status, error, at)``).

Threads and locks.  One scheduler thread picks what to deliver; up to
``max_connections`` sender threads (each with its own keep-alive
connection) POST.  Both use the fake's ``_lock`` (and its
``_updates_changed`` Condition, which ``push_update``, ``setWebhook`` and
``deleteWebhook`` notify) for the update queue and the webhook settings, and
it also guards everything in this object below ``__init__``'s comment.
No thread holds it while it POSTs.
"""

import http.client
import json
import queue
import ssl
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional
from urllib.parse import urlsplit

__all__ = ["WebhookDelivery", "WebhookAttempt"]

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


class WebhookAttempt(NamedTuple):
    """One try at delivering an update: ``status`` is the HTTP status the bot
    answered (None when there was no answer: ``error`` says why); ``at`` is
    ``time.monotonic()`` when the answer (or the failure) came."""

    update_id: int
    chat: Any
    status: Optional[int]
    error: str
    at: float


def _chat_of(update):
    """The chat an update belongs to (its order key), or None."""
    for value in update.values():
        if isinstance(value, dict):
            chat = value.get("chat")
            if isinstance(chat, dict) and "id" in chat:
                return chat["id"]
            message = value.get("message")
            if isinstance(message, dict) and isinstance(message.get("chat"), dict):
                return message["chat"].get("id")
    return None


class WebhookDelivery:
    """POSTs a :class:`FakeTelegramServer`'s queued updates to its webhook."""

    def __init__(self, fake: Any) -> None:
        self._fake = fake
        self.backoff = 0.1
        self.max_backoff = 2.0
        self.timeout = 10.0
        # Guarded by fake._lock:
        self._busy_chats = set()  # chats with a delivery in flight
        self._in_flight = set()  # update ids being POSTed
        self._tries: Dict[int, int] = {}  # update id -> failed tries so far
        self._next_try: Dict[int, float] = {}  # update id -> monotonic time of the next try
        self._attempts: List[WebhookAttempt] = []
        self._senders: List[threading.Thread] = []
        self._scheduler: Optional[threading.Thread] = None
        self._stopping = False
        self._work: "queue.Queue[Any]" = queue.Queue()

    # -- lifecycle (called by the fake's start/stop) -----------------------

    def start(self) -> None:
        with self._fake._lock:
            self._stopping = False
        thread = threading.Thread(target=self._schedule, name="fake-telegram-webhooks",
                                  daemon=True)
        self._scheduler = thread
        thread.start()

    def stop(self) -> None:
        with self._fake._lock:
            self._stopping = True
            self._fake._updates_changed.notify_all()
            senders, self._senders = self._senders, []
        for _ in senders:
            self._work.put(None)
        if self._scheduler is not None:
            self._scheduler.join(5)
        for thread in senders:
            thread.join(self.timeout + 1)

    def forget(self) -> None:
        """Called with the fake's lock held when its state is reset."""
        self._tries.clear()
        self._next_try.clear()
        self._attempts = []

    # -- the record ----------------------------------------------------------

    def attempts(self, update_id: Optional[int] = None) -> List[WebhookAttempt]:
        """Every delivery try so far (of one update, if given), in order."""
        with self._fake._lock:
            return [a for a in self._attempts if update_id is None or a.update_id == update_id]

    def info(self) -> Dict[str, Any]:
        """What ``getWebhookInfo`` answers.  Called with the fake's lock held."""
        fake = self._fake
        url = fake._webhook
        info = {"url": url or "", "has_custom_certificate": False,
                "pending_update_count": len(fake._updates) if url else 0}
        failures = [a for a in self._attempts if a.status is None or not 200 <= a.status < 300]
        if url and failures:
            last = failures[-1]
            info["last_error_date"] = int(time.time() - (time.monotonic() - last.at))
            info["last_error_message"] = last.error or "Wrong response from the webhook: %d" % (
                last.status,)
        options = fake._webhook_options
        info["max_connections"] = options.get("max_connections", 40)
        if options.get("allowed_updates") is not None:
            info["allowed_updates"] = options["allowed_updates"]
        return info

    # -- delivery ------------------------------------------------------------

    def _pick(self, now):
        """The next update to POST, or (None, seconds to wait or None).
        Called with the fake's lock held."""
        fake = self._fake
        options = fake._webhook_options
        if len(self._in_flight) >= options.get("max_connections", 40):
            return None, None
        blocked = set(self._busy_chats)
        soonest = None
        for update in fake._updates:
            uid = update["update_id"]
            chat = _chat_of(update)
            if uid in self._in_flight:
                continue
            if chat is not None and chat in blocked:
                continue
            due = self._next_try.get(uid, now)
            if due > now:
                soonest = due if soonest is None else min(soonest, due)
                if chat is not None:
                    blocked.add(chat)  # its later updates wait behind it
                continue
            return update, None
        return None, None if soonest is None else soonest - now

    def _schedule(self):
        fake = self._fake
        cond = fake._updates_changed
        with cond:
            while not self._stopping and not fake._stopping:
                url = fake._webhook
                if url is None:
                    cond.wait()
                    continue
                update, wait = self._pick(time.monotonic())
                if update is None:
                    cond.wait(wait)
                    continue
                uid, chat = update["update_id"], _chat_of(update)
                self._in_flight.add(uid)
                if chat is not None:
                    self._busy_chats.add(chat)
                if len(self._senders) < fake._webhook_options.get("max_connections", 40) and \
                        len(self._senders) < len(self._in_flight):
                    thread = threading.Thread(target=self._send_loop, daemon=True,
                                              name="fake-telegram-webhook-sender")
                    self._senders.append(thread)
                    thread.start()
                self._work.put((url, fake._webhook_options.get("secret_token"), update))

    def _send_loop(self):
        conns: Dict[tuple, Any] = {}
        try:
            while True:
                job = self._work.get()
                if job is None:
                    return
                url, secret, update = job
                status, error = self._post(conns, url, secret, update)
                self._done(update, status, error)
        finally:
            for conn in conns.values():
                conn.close()

    def _post(self, conns, url, secret, update):
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname, parts.port)
        body = json.dumps(update, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Connection": "keep-alive"}
        if secret:
            headers[SECRET_HEADER] = secret
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        for attempt in (1, 2):  # a kept-alive connection the bot closed: once more, fresh
            conn = conns.get(key)
            fresh = conn is None
            if fresh:
                if parts.scheme == "https":
                    conn = http.client.HTTPSConnection(
                        parts.hostname, parts.port, timeout=self.timeout,
                        context=ssl._create_unverified_context())  # noqa: S323 - loopback tests
                else:
                    conn = http.client.HTTPConnection(parts.hostname, parts.port,
                                                      timeout=self.timeout)
                conns[key] = conn
            try:
                conn.timeout = self.timeout
                if conn.sock is not None:
                    conn.sock.settimeout(self.timeout)
                conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.will_close:
                    conn.close()
                    del conns[key]
                return response.status, ""
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                del conns[key]
                if fresh or attempt == 2 or isinstance(exc, TimeoutError):
                    return None, "%s: %s" % (type(exc).__name__, exc)
        return None, "unreachable"  # pragma: no cover - the loop always returns

    def _done(self, update, status, error):
        fake = self._fake
        uid, chat = update["update_id"], _chat_of(update)
        now = time.monotonic()
        with fake._lock:
            self._in_flight.discard(uid)
            self._busy_chats.discard(chat)
            self._attempts.append(WebhookAttempt(uid, chat, status, error, now))
            if status is not None and 200 <= status < 300:
                fake._counts["webhook_delivered"] += 1
                self._tries.pop(uid, None)
                self._next_try.pop(uid, None)
                try:
                    fake._updates.remove(update)
                except ValueError:  # dropped meanwhile (deleteWebhook, reset)
                    pass
            else:
                fake._counts["webhook_failed"] += 1
                tries = self._tries.get(uid, 0) + 1
                self._tries[uid] = tries
                delay = min(self.max_backoff, self.backoff * 2 ** min(tries - 1, 30))
                self._next_try[uid] = now + delay
            fake._updates_changed.notify_all()
