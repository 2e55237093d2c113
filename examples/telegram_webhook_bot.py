"""The echo bot of telegram_echo_bot.py behind a webhook.

Run it as a service (cheroot serves it: ``pip install 'fastdispatch[telegram,webhook]'``);
it registers the webhook, serves /healthz and /metrics beside it, and on
SIGTERM stops taking updates, drains its replies and exits non-zero if any
was dropped:

    TELEGRAM_BOT_TOKEN=123456:ABC... WEBHOOK_URL=https://bot.example.com/telegram \\
        PORT=8080 python examples/telegram_webhook_bot.py

Or behind gunicorn, whose hooks in gunicorn.conf.py give the same guarantees
(register the webhook yourself then, with WEBHOOK_SECRET as its secret_token):

    cd examples && TELEGRAM_BOT_TOKEN=... WEBHOOK_SECRET=... \\
        gunicorn -c gunicorn.conf.py telegram_webhook_bot:application

Environment: ``TELEGRAM_BOT_TOKEN`` (required), ``TELEGRAM_API_URL`` (default
Telegram's; a FakeTelegramServer's for a local try), ``WEBHOOK_URL`` (the
public URL Telegram posts to; registered with ``setWebhook`` when set),
``WEBHOOK_SECRET`` (the secret token; made up when not set), ``LISTEN``
(default 127.0.0.1: a TLS-terminating proxy in front), ``PORT`` (8080),
``DRAIN_TIMEOUT`` (30 s).
"""

import logging
import os
import secrets
import sys

from telegram_echo_bot import make_engine

from fastdispatch.telegram import TelegramSender, run_webhook, webhook_app

TOKEN = os.environ.get("TELEGRAM_BOT_TOKEN")
if not TOKEN:
    sys.exit("set TELEGRAM_BOT_TOKEN (python examples/telegram_echo_bot.py runs without one)")
SECRET = os.environ.get("WEBHOOK_SECRET") or secrets.token_urlsafe(32)

sender = TelegramSender(TOKEN, base_url=os.environ.get("TELEGRAM_API_URL",
                                                       "https://api.telegram.org"))
engine = make_engine()

# What a WSGI server of your own serves (gunicorn.conf.py drains it on SIGTERM).
application = webhook_app(engine, sender, secret_token=SECRET)


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return run_webhook(engine, sender, listen=os.environ.get("LISTEN", "127.0.0.1"),
                       port=int(os.environ.get("PORT", "8080")), url_path="/telegram",
                       webhook_url=os.environ.get("WEBHOOK_URL"), secret_token=SECRET,
                       drain_timeout=float(os.environ.get("DRAIN_TIMEOUT", "30")))


if __name__ == "__main__":
    sys.exit(main())
