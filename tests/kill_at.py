"""Runs a job module's ``main`` as ``python -m`` does, and SIGKILLs it at a chosen point: the n-th call of a function
(optionally only the calls with an argument containing some text), just before or just after it runs.

    python tests/kill_at.py --function components.lib.storage:publish --matching manifest.json -- \
        components.shards --output ...

A real SIGKILL of the real process: no handler, no flush, no cleanup runs, as when a VM is preempted or
the kernel's OOM killer strikes. The crash tests use it to stop a job at exact, repeatable places.

Other actions at that point: ``--action term`` sends the process a SIGTERM (as Vertex AI does before a preemption)
and goes on; ``--action hang`` makes the call never return, never giving Python's signal handlers a turn, as a long
native call does (the TPU's initialisation, a compile); ``--action nan`` sets every weight of the model its first
argument holds (a ``TrainingState``) to NaN and goes on, as a step that blew up would leave them; ``--action
unavailable`` raises TensorFlow's ``UnavailableError`` in place of the call, as a TPU worker not answering yet does.
``--exit_grace`` shortens the time a SIGTERM'd step has to stop before it is ended.
"""

import argparse
import importlib
import os
import signal
import sys


def hang() -> None:
    """Blocks the calling thread for good, as a long native call does (the TPU's initialisation, a compile): with
    SIGTERM blocked in this thread, the wait is never interrupted and Python's handlers never get a turn here."""
    import threading

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Event().wait()


def arm(function: str, matching: str, nth: int, after: bool, action: str = "kill", marker: str = "") -> None:
    module_name, _, attribute = function.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = attribute.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    original = getattr(owner, name)
    calls = 0

    def act(args: tuple) -> None:
        if marker:  # for a test to wait on a state, not on a log line
            open(marker, "w").close()
        if action == "nan":
            for weight in args[0].model.weights:
                weight.assign(weight * float("nan"))
            return
        if action == "hang":
            hang()
        if action == "unavailable":
            import tensorflow as tf

            raise tf.errors.UnavailableError(None, None, "Socket closed")
        os.kill(os.getpid(), signal.SIGTERM if action == "term" else signal.SIGKILL)

    def wrapper(*args, **kwargs):
        nonlocal calls
        if matching and not any(matching in str(value) for value in (*args, *kwargs.values())):
            return original(*args, **kwargs)
        calls += 1
        if calls == nth and not after:
            act(args)
        result = original(*args, **kwargs)
        if calls == nth and after:
            act(args)
        return result

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--function", required=True, help="module:function or module:Class.method")
    parser.add_argument("--matching", default="", help="count only calls with an argument containing this")
    parser.add_argument("--nth", type=int, default=1, help="act at this (counted) call")
    parser.add_argument("--after", action="store_true", help="act just after the call returns, not before")
    actions = ("kill", "term", "hang", "nan", "unavailable")
    parser.add_argument("--action", choices=actions, default="kill", help="what to do there")
    parser.add_argument("--marker", default="", help="a file to create just before acting")
    parser.add_argument(
        "--exit_grace",
        type=float,
        default=0.0,
        help="seconds a SIGTERM'd step has to stop before it is ended (components.lib.preemption's 15 s if 0): the "
        "tests of a step that cannot stop need not wait what a TPU job waits",
    )
    split = sys.argv.index("--")
    options = parser.parse_args(sys.argv[1:split])
    module, *arguments = sys.argv[split + 1 :]  # after "--": the module to run, then its arguments
    arm(options.function, options.matching, options.nth, options.after, options.action, options.marker)
    if options.exit_grace:
        from components.lib.preemption import StopRequest

        StopRequest.EXIT_GRACE = options.exit_grace
    # the module's own main(), not runpy: a second copy of the module as __main__ would not be armed
    sys.exit(importlib.import_module(module).main(arguments))


if __name__ == "__main__":
    main()
