"""A Telegram bot for the shutdown tests, run in a subprocess.

    python tests/telegram_bot_process.py polling|webhook|waitress
    gunicorn -c examples/gunicorn.conf.py --chdir tests telegram_bot_process:application

Configured by the environment: ``BOT_BASE_URL`` (the FakeTelegramServer),
``BOT_PORT`` (webhook port), ``BOT_REPLIES`` (replies per update, default 1),
``BOT_MAX_INFLIGHT`` (default 4: replies queue up behind slow answers),
``BOT_DRAIN_TIMEOUT`` (default 30), ``BOT_HEALTH_PORT`` (polling: serve
/healthz and /metrics there), ``BOT_WEBHOOK_URL`` (register it).  Every reply
is ``"<update text> /<k>"``, so a test can tell which update each answers.
"""

import logging
import os
import sys

from fastdispatch import Engine, OutboundDispatcher, RetryPolicy
from fastdispatch.telegram import TelegramSender, run_polling, run_webhook, webhook_app

logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                    format="%(asctime)s %(name)s %(levelname)s %(message)s")
logging.getLogger("urllib3").setLevel(logging.ERROR)

REPLIES = int(os.environ.get("BOT_REPLIES", "1"))
DRAIN_TIMEOUT = float(os.environ.get("BOT_DRAIN_TIMEOUT", "30"))

sender = TelegramSender("123:shutdown", base_url=os.environ["BOT_BASE_URL"])
engine = Engine(OutboundDispatcher(max_inflight=int(os.environ.get("BOT_MAX_INFLIGHT", "4")),
                                   queue_size=1000, retry=RetryPolicy()))


@engine.on()
def echo(ctx):
    for k in range(REPLIES):
        ctx.reply_text("%s /%d" % (ctx.event.text, k))


# For a WSGI server of its own (gunicorn): examples/gunicorn.conf.py drains it.
application = webhook_app(engine, sender, secret_token="s3cret")


def serve_with_waitress(port):
    """docs/telegram.md's recipe for waitress, as written there."""
    import signal

    import waitress.server

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM: as Ctrl-C
    server = waitress.server.create_server(application, host="127.0.0.1", port=port,
                                           threads=8)
    try:
        server.run()  # returns on Ctrl-C/SIGTERM, the requests in progress answered
    finally:
        server.close()  # no new connections: Telegram delivers those updates again later
    return application.shutdown(DRAIN_TIMEOUT).exit_code


def main(mode):
    if mode == "waitress":
        return serve_with_waitress(int(os.environ["BOT_PORT"]))
    if mode == "polling":
        health = os.environ.get("BOT_HEALTH_PORT")
        return run_polling(engine, sender, poll_timeout=1, drain_timeout=DRAIN_TIMEOUT,
                           health_port=int(health) if health else None)
    return run_webhook(engine, sender, port=int(os.environ["BOT_PORT"]), url_path="/hook",
                       webhook_url=os.environ.get("BOT_WEBHOOK_URL"), secret_token="s3cret",
                       drain_timeout=DRAIN_TIMEOUT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
