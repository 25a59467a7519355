"""A process that stutters: SIGSTOP for 0.05-0.3 s about every 0.4 s, while a block runs."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator

from bench.stack import Process


@contextlib.contextmanager
def stuttering(process: Process, seed: int = 0) -> Iterator[None]:
    """A tokenizer that stutters (CPU contention, a GC pause) holds a step's detokenization open while
    the scheduler admits the next request: the overlap that broke the gateway, rare on an idle machine.
    """
    stop = threading.Event()

    def loop() -> None:
        rng = random.Random(seed)
        while not stop.wait(rng.uniform(0.2, 0.6)):
            process.pause()
            time.sleep(rng.uniform(0.05, 0.3))
            process.resume()

    thread = threading.Thread(target=loop, daemon=True, name=f"stutter {process.name}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        process.resume()
