import logging
from types import SimpleNamespace

from components.lib import progress as progress_module
from components.lib.progress import Progress


def test_progress_lines_show_totals_rates_and_eta(caplog, monkeypatch):
    clock = iter([100.0, 110.0, 120.0])
    # the module's clock only: time.monotonic itself is every thread's of this test process (a stand-in's, a lease's)
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    caplog.set_level(logging.INFO, logger="tpu_mlm.progress")
    done = {"fraction": 0.25}
    progress = Progress("shards train", lambda: done["fraction"], interval=5.0)
    progress.update(texts=1_000, tokens=50_000)  # at 110 s: 10 s elapsed
    assert caplog.messages == [
        "shards train: texts 1,000 (100/s), tokens 50,000 (5,000/s), 25% done, ETA 0:00:30, elapsed 0:00:10"
    ]
    done["fraction"] = None
    progress.update(texts=1_000)  # at 120 s, size unknown: no ETA
    assert caplog.messages[-1] == "shards train: texts 2,000 (100/s), tokens 50,000 (2,500/s), elapsed 0:00:20"
