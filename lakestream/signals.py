"""Stopping long-running commands cleanly: SIGTERM and SIGINT ask them to stop after the current step."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def install_stop_signals(stop: threading.Event, what: str = "lakestream") -> Callable[[], None]:
    """SIGTERM/SIGINT set ``stop``; a second SIGINT raises KeyboardInterrupt. Returns the undo.

    Signal handlers can only be installed from the main thread; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("%s: %s received, stopping cleanly", what, signal.Signals(signum).name)
        stop.set()

    for sig in previous:
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
