"""Run by tests/test_asyncckpt/test_attacks_resume.py in a process of its own: a forward and
reverse sweep of a state of mixed dtypes (a float64 field beside an int64 counter, one
``ArrayCheckpoint``) with a run directory, killed by a real SIGKILL at a point named by
``ATTACK_KILL``, else printing one JSON line: what it resumed from, the gradient, the outputs.

Usage: attack_job.py RUN_DIR N INTERVAL|auto [OPTION=VALUE ...]; ``ATTACK_KILL`` is one of
``replace-before:K`` / ``replace-after:K`` (around the K-th rename of a manifest into place),
``unlink:K`` (at the K-th file removal of ``close``), ``between`` (after the forward sweep
returned), ``done`` (after the reverse sweep returned, before ``close``), ``fwd:S`` / ``rev:S``
(at step S of the forward operator, or its reverse), ``timer:T`` (T seconds after the
checkpointer is made, wherever the run is then). ``ATTACK_SEED`` is the adjoint's seed: a
number, or ``state`` (the script seeds from the final state: J = |x_n|^2 / 2);
``ATTACK_ADJOINT=0`` gives no ``adjoint=``, ``ATTACK_OUTPUTS=0`` no ``outputs=``;
``ATTACK_LOSE=K`` makes every Level-2 write of u_K fail (a lost state).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from asyncckpt import ArrayCheckpoint, AsyncCheckpointer

M = 7  # the field's length


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Mixed:
    """x_{t+1} = tanh(a x_t + 1e-7 k_t[0] + b_t), k_{t+1} = (3 k_t[0] + round(1000 sum x), k_t[1]
    + 1): its adjoint, of the loss sum(seed * x_n) by a, through x only."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(7)
        self.n = n
        self.a = rng.uniform(0.5, 1.5, M)
        self.b = rng.standard_normal((5, M))
        self.x = rng.standard_normal(M)
        self.k = np.array([3, 0], np.int64)
        self.x0, self.k0 = self.x.copy(), self.k.copy()
        self.checkpoint = ArrayCheckpoint([self.x, self.k])
        # outputs of another size and dtype: a trace of x[0] as float32, and k[0] per step
        self.trace = np.zeros(n + 1, np.float32)
        self.counts = np.zeros(n + 1, np.int64)
        self.lam = np.zeros(M)
        self.grad = np.zeros(M)
        self.taped = -1
        self.forward_steps = 0

    def step(self, t: int) -> None:
        self.x_in, self.k_in, self.taped = self.x.copy(), self.k.copy(), t
        self.x[...] = np.tanh(self.a * self.x + 1e-7 * self.k[0] + self.b[t % 5])
        self.k[0] = (3 * self.k[0] + int(round(1000 * self.x.sum()))) % 1000003
        self.k[1] += 1
        self.trace[t + 1], self.counts[t + 1] = self.x[0], self.k[0]
        self.forward_steps += 1

    def adjoint(self, t: int) -> None:
        assert self.taped == t, (self.taped, t)
        pre = self.a * self.x_in + 1e-7 * self.k_in[0] + self.b[t % 5]
        dx = self.lam * (1 - np.tanh(pre) ** 2)
        self.grad += dx * self.x_in
        self.lam[...] = dx * self.a


class Arrays:
    """A descriptor of a fixed list of arrays (outputs=, adjoint=)."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays
        self.size = sum(a.size for a in arrays)
        self.dtype = arrays[0].dtype

    def get_data(self, t: int) -> list[np.ndarray]:
        return self.arrays

    get_data_location = get_data


def seed_adjoint(model: Mixed, seed: float | str) -> None:
    """The script's seeding between the sweeps: a number, or from the final state ("state")."""
    model.lam[...] = model.x if seed == "state" else float(seed)


def live(model: Mixed) -> str:
    """The live state, as hex."""
    return model.x.tobytes().hex() + model.k.tobytes().hex()


def reference(n: int, seed: float | str = 1.0) -> dict:
    """Store-all: every state kept, each step taped again from its stored state. What the
    program sees: the gradient, the outputs, the live state after the forward sweep and the
    adjoint after the reverse."""
    model = Mixed(n)
    states = []
    model.trace[0], model.counts[0] = model.x[0], model.k[0]
    for t in range(n):
        states.append((model.x.copy(), model.k.copy()))
        model.step(t)
    outputs = [model.trace.tobytes().hex(), model.counts.tobytes().hex()]
    final = live(model)
    seed_adjoint(model, seed)
    for t in range(n - 1, -1, -1):
        model.x[...], model.k[...] = states[t]
        model.step(t)
        model.adjoint(t)
    return {"grad": model.grad.tobytes().hex(), "outputs": outputs, "live": final,
            "lam": model.lam.tobytes().hex(), "left": live(model)}


def operators(model: Mixed, kill: str) -> tuple[object, object]:
    kind, _, at = kill.partition(":")
    pause = float(os.environ.get("ATTACK_STEP_S", "0"))  # a step's time: commits keep up

    class Forward:
        def apply(self, *, t_start: int, t_end: int) -> None:
            for t in range(t_start, t_end):
                model.step(t)
                time.sleep(pause)
                if kind == "fwd" and t + 1 == int(at):
                    die()

    class Reverse:
        def apply(self, *, t_start: int, t_end: int) -> None:
            model.adjoint(t_start)
            if kind == "rev" and t_start == int(at):
                die()
    return Forward(), Reverse()


def arm(kill: str) -> None:
    """Kill inside the run directory's own file operations, where ``kill`` says."""
    kind, _, at = kill.partition(":")
    count = [0]
    if kind.startswith("replace"):
        real = os.replace

        def replace(src, dst, *args, **kwargs):
            hit = str(dst).endswith("manifest.json") and (count.__setitem__(0, count[0] + 1)
                                                          or count[0] == int(at))
            if hit and kind == "replace-before":
                die()
            real(src, dst, *args, **kwargs)
            if hit:
                die()
        os.replace = replace
    elif kind == "lose":
        from asyncckpt.storage.durable import DurableFileStorage
        real_put = DurableFileStorage.put

        def put(self, key, buf):
            if key == int(at):
                raise OSError(5, "Input/output error (injected)")
            real_put(self, key, buf)
        DurableFileStorage.put = put
    elif kind == "unlink":
        real_unlink = Path.unlink

        def unlink(self, *args, **kwargs):
            real_unlink(self, *args, **kwargs)
            count[0] += 1
            if count[0] == int(at):
                die()
        Path.unlink = unlink


def run(run_dir: str, n: int, interval: int | str, kill: str = "", seed: float | str = 1.0,
        *, with_outputs: bool = True, with_adjoint: bool = True, lose: int | None = None,
        **options: object) -> dict:
    """The documented script (docs/resume.md): apply_forward(), the adjoint seeded, then
    apply_reverse(); what the program sees after each call."""
    model = Mixed(n)
    model.trace[0], model.counts[0] = model.x[0], model.k[0]
    fwd, rev = operators(model, kill)
    if kill.startswith(("replace", "unlink")):
        arm(kill)
    if lose is not None:
        arm(f"lose:{lose}")
    if kill.startswith("timer:"):
        threading.Timer(float(kill.partition(":")[2]), die).start()
    with AsyncCheckpointer(
            model.checkpoint, fwd, rev, n, interval=interval, run_dir=run_dir,
            outputs=Arrays([model.trace, model.counts]) if with_outputs else None,
            adjoint=Arrays([model.lam, model.grad]) if with_adjoint else None,
            **options) as ckp:
        resumed = ckp.resumed
        ckp.apply_forward()
        after_forward = live(model)
        if kill == "between":
            die()
        seed_adjoint(model, seed)  # the script's seeding, done again on resume (docs)
        ckp.apply_reverse()
        if kill == "done":
            die()
    return {"resumed": resumed, "grad": model.grad.tobytes().hex(),
            "outputs": [model.trace.tobytes().hex(), model.counts.tobytes().hex()],
            "forward_steps": model.forward_steps, "live": after_forward,
            "lam": model.lam.tobytes().hex(), "left": live(model)}


def main() -> None:
    run_dir, n = sys.argv[1], int(sys.argv[2])
    interval = sys.argv[3] if sys.argv[3] == "auto" else int(sys.argv[3])
    options: dict = {"l1_slots": 2}
    for arg in sys.argv[4:]:
        name, _, value = arg.partition("=")
        options[name] = json.loads(value)
    seed = os.environ.get("ATTACK_SEED", "1.0")
    lose = os.environ.get("ATTACK_LOSE")
    print(json.dumps(run(run_dir, n, interval, os.environ.get("ATTACK_KILL", ""),
                         seed if seed == "state" else float(seed),
                         with_outputs=os.environ.get("ATTACK_OUTPUTS", "1") == "1",
                         with_adjoint=os.environ.get("ATTACK_ADJOINT", "1") == "1",
                         lose=None if lose is None else int(lose), **options)), flush=True)


if __name__ == "__main__":
    main()
