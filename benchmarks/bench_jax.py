"""asyncckpt.jax.checkpoint_scan against JAX's own ways to differentiate a long scan, each
method and n in a process of its own (peak RSS per method), and every method of an n again in
one process, timed in turns (``paired``: ratios side by side, under the same load), printed as a
table and one JSON line.

Workloads: ``gru``, a GRU language model (hidden 128, batch 32, float32: 16 KiB carries), and
``wave``, a 2D acoustic wave equation (64 x 64, float64, two time levels: 64 KiB carries)
differentiated with respect to its velocity model. Methods, each differentiating the same loss:

- ``plain``: ``jax.grad`` of ``lax.scan`` (every step's residuals kept); also times one forward
  sweep, so the floor is its gradient plus one more forward sweep;
- ``remat``: ``lax.scan`` of ``jax.checkpoint(step)`` (a carry kept per step);
- ``nested``: ``jax.checkpoint`` over each step and over chunks of them, nested in as few
  levels as fit the budget (the same bytes as ``asyncckpt``'s);
- ``asyncckpt``: ``checkpoint_scan`` with the budget (Level-2 beyond it in the temporary
  directory).

The budget is ``--share`` of the carries of the run (2% by default), or ``--budget`` bytes at
every n. ``rss_growth_mib`` is the peak
RSS during the gradients over the RSS before them (the program compiled), sampled every
millisecond.

Usage: python benchmarks/bench_jax.py [--workload gru] [--n 1000,10000,100000] [--share 0.02]
       [--methods plain,nested,asyncckpt] [--paired-rounds 7]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_flag, record  # noqa: E402

METHODS = ("plain", "remat", "nested", "asyncckpt")


def workload(name: str, n: int):
    """(loss(params, carry0, xs), params, carry0, xs, carry bytes, residual bytes a step)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    if name == "gru":
        hidden, batch, vocab = 128, 32, 128
        params = {k: jnp.asarray(rng.standard_normal(s) * 0.1, jnp.float32) for k, s in (
            ("embed", (vocab, hidden)), ("wz", (2 * hidden, hidden)),
            ("wr", (2 * hidden, hidden)), ("wh", (2 * hidden, hidden)),
            ("head", (hidden, vocab)))}
        tokens = jnp.asarray(rng.integers(0, vocab, (n + 1, batch)), jnp.int32)
        xs = (tokens[:-1], tokens[1:])
        carry0 = jnp.zeros((batch, hidden), jnp.float32)

        def step(p, h, x):
            token, target = x
            e = p["embed"][token]
            he = jnp.concatenate([h, e], axis=-1)
            z, r = jax.nn.sigmoid(he @ p["wz"]), jax.nn.sigmoid(he @ p["wr"])
            cand = jnp.tanh(jnp.concatenate([r * h, e], axis=-1) @ p["wh"])
            h = (1 - z) * h + z * cand
            logits = jax.nn.log_softmax(h @ p["head"])
            return h, -jnp.mean(jnp.take_along_axis(logits, target[:, None], axis=-1))
    else:
        size = 64
        params = {"c2": jnp.asarray(0.2 + 0.05 * rng.random((size, size)), jnp.float64)}
        t = np.arange(n) * 0.05
        xs = jnp.asarray(np.exp(-((t - 3.0) ** 2)) * np.sin(4 * t), jnp.float64)
        carry0 = (jnp.zeros((size, size), jnp.float64), jnp.zeros((size, size), jnp.float64))

        def step(p, carry, source):
            prev, u = carry
            lap = (jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1)
                   + jnp.roll(u, -1, 1) - 4 * u)
            new = 2 * u - prev + p["c2"] * lap
            new = new.at[size // 2, size // 2].add(source)
            return (u, 0.999 * new), new[size // 4, size // 4]

    def residuals(p, c, x):
        return jax.tree_util.tree_leaves(jax.vjp(lambda c: step(p, c, x), c)[1])

    x0 = jax.tree_util.tree_map(lambda a: a[0], xs)
    nbytes = lambda tree: sum(a.size * a.dtype.itemsize  # noqa: E731
                              for a in jax.tree_util.tree_leaves(tree))
    resid = nbytes(jax.eval_shape(residuals, params, carry0, x0))
    return step, params, carry0, xs, nbytes(carry0), resid


class RssSampler:
    """The peak of this process's RSS over its RSS when made, sampled every millisecond on a
    thread until :meth:`stop`."""

    def __init__(self) -> None:
        import threading

        import psutil

        self._process = psutil.Process()
        self.base = self.peak = self._process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return max(self.peak - self.base, 0)


def nested_levels(n: int, carry: int, resid: int, budget: int) -> tuple[int, int]:
    """The fewest levels of ``jax.checkpoint`` (over each step, then over chunks of chunks)
    whose carries and one step's residuals fit ``budget``, and their chunk length."""
    for levels in range(1, 9):
        chunk = max(1, math.ceil(n ** (1 / levels)))
        if levels * chunk * carry + resid <= budget:
            return levels, chunk
    return 8, max(1, math.ceil(n ** (1 / 8)))


def nested_scan(step, carry, xs, n: int, levels: int, chunk: int):
    """``lax.scan`` of ``step`` as ``levels`` nested scans, each over ``jax.checkpoint``-ed
    chunks of the next (the innermost over ``jax.checkpoint``-ed steps)."""
    import jax
    from jax import lax

    if levels <= 1 or n <= chunk:
        return lax.scan(jax.checkpoint(step), carry, xs, length=n)
    inner = chunk ** (levels - 1)
    outer = n // inner
    cut = outer * inner
    body = jax.checkpoint(lambda c, x: nested_scan(step, c, x, inner, levels - 1, chunk))
    head = jax.tree_util.tree_map(lambda a: a[:cut].reshape(outer, inner, *a.shape[1:]), xs)
    carry, ys = lax.scan(body, carry, head)
    ys = jax.tree_util.tree_map(lambda a: a.reshape(cut, *a.shape[2:]), ys)
    if cut < n:
        tail = jax.tree_util.tree_map(lambda a: a[cut:], xs)
        carry, rest = nested_scan(step, carry, tail, n - cut, levels - 1, chunk)
        ys = jax.tree_util.tree_map(lambda a, b: jax.numpy.concatenate([a, b]), ys, rest)
    return carry, ys


class Compiled(NamedTuple):
    """A method's gradient of the workload's loss, compiled, and what it was made with."""

    grad: Any
    #: the loss alone (``plain``: the floor's forward sweep), else None
    forward: Any
    args: tuple[Any, Any]
    budget: int
    carry_bytes: int
    resid: int
    levels: int | None


def compiled(name: str, method: str, n: int, share: float,
             fixed: str | None = None) -> Compiled:
    """``method``'s gradient of the workload ``name``'s loss over ``n`` steps, compiled."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    jax.config.update("jax_enable_x64", True)
    from asyncckpt.jax import checkpoint_scan
    from asyncckpt.planning import parse_bytes

    step, params, carry0, xs, carry_bytes, resid = workload(name, n)
    budget = (parse_bytes("--budget", fixed) if fixed is not None
              else max(int(share * n * carry_bytes), 64 << 10))
    levels = chunk = None
    if method == "nested":
        levels, chunk = nested_levels(n, carry_bytes, resid, budget)

    def scan(p, c, x):
        body = lambda c, x: step(p, c, x)  # noqa: E731
        if method == "plain":
            return lax.scan(body, c, x)
        if method == "remat":
            return lax.scan(jax.checkpoint(body), c, x)
        if method == "nested":
            return nested_scan(body, c, x, n, levels, chunk)
        return checkpoint_scan(body, c, x, memory_budget=budget)

    def loss(p, c):
        final, ys = scan(p, c, xs)
        return jnp.sum(ys) + sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(final))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, carry0).compile()
    forward = jax.jit(loss).lower(params, carry0).compile() if method == "plain" else None
    return Compiled(grad, forward, (params, carry0), budget, carry_bytes, resid, levels)


def paired(name: str, methods: list[str], n: int, share: float, repeats: int,
           fixed: str | None = None) -> dict:
    """Median seconds of every method's gradient (and of ``plain``'s forward sweep), all
    compiled in one process and timed in turns, ``repeats`` rounds after two warm ones: their
    ratios measured side by side, under the same load (the processes of their own give each
    its RSS, and times that drift between processes)."""
    import jax

    calls = {}
    for method in methods:
        made = compiled(name, method, n, share, fixed)
        calls[method] = (made.grad, made.args)
        if made.forward is not None:
            calls["forward"] = (made.forward, made.args)
    seconds: dict[str, list[float]] = {key: [] for key in calls}
    for round_ in range(repeats + 2):
        for key, (call, args) in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call(*args))
            if round_ >= 2:
                seconds[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in seconds.items()}


def child(name: str, method: str, n: int, share: float, repeats: int, out: Path,
          fixed: str | None = None) -> dict:
    import jax

    from asyncckpt.jax import last_stats

    made = compiled(name, method, n, share, fixed)
    sampler = RssSampler()  # from here: the gradients' memory, not the compiler's
    seconds = []
    for _ in range(repeats + 1):  # the first also warms the pool and the cost memory
        start = time.perf_counter()
        result = jax.block_until_ready(made.grad(*made.args))
        seconds.append(time.perf_counter() - start)
    growth = sampler.stop()
    seconds = seconds[1:]
    forward_s = None
    if made.forward is not None:
        jax.block_until_ready(made.forward(*made.args))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(made.forward(*made.args))
            times.append(time.perf_counter() - start)
        forward_s = statistics.median(times)
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(result)]
    np.savez(out, *leaves)
    stats = last_stats() if method == "asyncckpt" else None
    return {"workload": name, "method": method, "n": n, "seconds": statistics.median(seconds),
            "forward_s": forward_s, "rss_growth_mib": growth / 2**20,
            "budget_mib": made.budget / 2**20, "carry_kib": made.carry_bytes / 1024,
            "residual_kib": made.resid / 1024, "levels": made.levels,
            "l2_writes": None if stats is None else stats.l2_writes}


def run_paired(args: argparse.Namespace, n: int) -> dict[str, float]:
    """:func:`paired` in a process of its own (empty where it failed: said on stderr)."""
    done = subprocess.run(
        [sys.executable, __file__, "--workload", args.workload, "--n", str(n),
         "--share", str(args.share), "--methods", args.methods,
         "--paired-rounds", str(args.paired_rounds),
         *(["--budget", args.budget] if args.budget else []), "--child", "paired", "-"],
        capture_output=True, text=True, env={**os.environ})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        print(f"n = {n}: the paired timing failed: {done.stderr.strip()[-500:]}",
              file=sys.stderr)
        return {}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="gru", choices=("gru", "wave"))
    parser.add_argument("--n", default="1000,10000,100000")
    parser.add_argument("--share", type=float, default=0.02)
    parser.add_argument("--budget", default=None,
                        help="a budget in bytes for every n (e.g. 8MiB) instead of --share")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--paired-rounds", type=int, default=7,
                        help="rounds of every method's gradient timed in turns in one process "
                             "per n, beside the processes of their own (0: none)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    add_flag(parser)
    args = parser.parse_args()
    if args.child and args.child[0] == "paired":
        print(json.dumps(paired(args.workload, args.methods.split(","), int(args.n),
                                args.share, args.paired_rounds, args.budget)))
        return 0
    if args.child:
        method, out = args.child
        print(json.dumps(child(args.workload, method, int(args.n), args.share, args.repeats,
                               Path(out), args.budget)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(v) for v in args.n.split(",")]:
            grads = {}
            for method in args.methods.split(","):
                out = Path(tmp) / f"{method}-{n}.npz"
                done = subprocess.run(
                    [sys.executable, __file__, "--workload", args.workload, "--n", str(n),
                     "--share", str(args.share), "--repeats", str(args.repeats),
                     *(["--budget", args.budget] if args.budget else []),
                     "--child", method, str(out)],
                    capture_output=True, text=True, env={**os.environ})
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode or not lines:
                    rows.append({"workload": args.workload, "method": method, "n": n,
                                 "error": done.stderr.strip().splitlines()[-1:]})
                    continue
                row = json.loads(lines[-1])
                with np.load(out) as saved:
                    grads[method] = [saved[k] for k in sorted(saved.files,
                                                              key=lambda k: int(k[4:]))]
                rows.append(row)
            side_by_side = run_paired(args, n) if args.paired_rounds > 0 else {}
            for row in rows:
                if row["n"] == n and row.get("method") in side_by_side:
                    row["paired_s"] = side_by_side[row["method"]]
                    if "plain" in side_by_side:
                        row["paired_over_floor"] = row["paired_s"] / (
                            side_by_side["plain"] + side_by_side["forward"])
            plain = next((r for r in rows if r.get("method") == "plain" and r["n"] == n
                          and "seconds" in r), None)
            for row in rows:
                if row["n"] != n or "seconds" not in row:
                    continue
                if plain is not None:
                    row["over_floor"] = row["seconds"] / (plain["seconds"] + plain["forward_s"])
                if "plain" in grads and row["method"] in grads:
                    ours, ref = grads[row["method"]], grads["plain"]
                    row["max_rel_grad_error"] = max(
                        float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))
                        for a, b in zip(ours, ref))
    print(f"{'n':>7} {'method':>10} {'seconds':>8} {'/floor':>7} {'paired':>7} "
          f"{'/floor':>7} {'RSS MiB':>8} {'rel err':>9} levels/L2 writes")
    nan = float("nan")
    for row in rows:
        if "seconds" not in row:
            print(f"{row['n']:>7} {row['method']:>10} failed: {row['error']}")
            continue
        extra = row["levels"] if row["method"] == "nested" else row["l2_writes"]
        print(f"{row['n']:>7} {row['method']:>10} {row['seconds']:8.3f} "
              f"{row.get('over_floor', nan):7.3f} {row.get('paired_s', nan):7.3f} "
              f"{row.get('paired_over_floor', nan):7.3f} {row['rss_growth_mib']:8.1f} "
              f"{row.get('max_rel_grad_error', nan):9.2e} {extra}")
    for n in sorted({row["n"] for row in rows}):
        paired_s = {row["method"]: row["paired_s"] for row in rows
                    if row["n"] == n and "paired_s" in row}
        if "nested" in paired_s and "asyncckpt" in paired_s:
            print(f"n = {n}: nested / asyncckpt {paired_s['nested'] / paired_s['asyncckpt']:.3f}"
                  " side by side in one process")
    print(json.dumps({"workload": args.workload, "share": args.share, "budget": args.budget,
                      "rows": rows}))
    for row in rows:
        record("bench_jax", {"share": args.share, "budget": args.budget, **row},
               ["workload", "n", "share", "budget", "method"], args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
