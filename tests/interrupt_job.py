"""Run by tests/test_asyncckpt/test_faults.py in a process of its own: a real SIGINT at random
points of many runs (Ctrl-C anywhere in the library), each interrupted run followed by one
that must give store-all's adjoint bit for bit. Prints one JSON line."""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from asyncckpt import AsyncCheckpointer  # noqa: E402
from workloads import Forward, RecurrentCell, Reverse, store_all_reference  # noqa: E402


def main() -> None:
    points, seed, storage = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    n = 60
    model, reference = RecurrentCell(n), store_all_reference(RecurrentCell(n))
    rng = random.Random(seed)
    bad: list[str] = []
    interrupted = 0

    def run() -> None:
        model.reset()
        ckp.apply_forward()
        model.reset_adjoint()
        ckp.apply_reverse()

    with AsyncCheckpointer(model, Forward(model), Reverse(model), n, l1_slots=3, interval=4,
                           storage=None if storage == "dram" else storage) as ckp:
        run()
        length = ckp.stats.forward_s + ckp.stats.reverse_s
        for point in range(points):
            timer = threading.Timer(rng.uniform(0, 1.2 * length), os.kill,
                                    (os.getpid(), signal.SIGINT))
            try:
                timer.start()
                run()
                time.sleep(0.3 * length)  # a late signal lands here, not in the next run
            except KeyboardInterrupt:
                interrupted += 1
            except Exception as exc:  # noqa: BLE001 - what an interrupt broke is the finding
                bad.append(f"{point}: {exc!r}")
            finally:
                timer.cancel()
                timer.join()
            # on a loaded machine the signal may still land after the timer ended: a run it
            # cuts short is run again (another test of reuse), one it leaves whole is checked
            for _ in range(3):
                try:
                    run()
                except KeyboardInterrupt:
                    continue
                except Exception as exc:  # noqa: BLE001 - the checkpointer broke for good
                    bad.append(f"{point}: {exc!r}")
                    break
                if any(a.tobytes() != b.tobytes()
                       for a, b in zip(model.gradients(), reference)):
                    bad.append(f"{point}: a wrong gradient after the interrupt")
                break
    print(json.dumps({"points": points, "interrupted": interrupted, "bad": bad[:10],
                      "bad_count": len(bad)}), flush=True)


if __name__ == "__main__":
    main()
