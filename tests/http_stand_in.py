"""What the tests' HTTP stand-ins (Vertex AI, the Hub, Cloud Quotas) share: their server's thread."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

# how often a stand-in's server looks for its shutdown: at http.server's default (0.5 s) every test that used a
# stand-in waited up to that long at its end
SHUTDOWN_POLL_SECONDS = 0.02


def serving_thread(server: ThreadingHTTPServer) -> threading.Thread:
    """The thread that serves ``server`` until its ``shutdown()``, which then returns within a poll."""
    return threading.Thread(target=server.serve_forever, args=(SHUTDOWN_POLL_SECONDS,), daemon=True)
