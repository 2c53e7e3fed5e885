"""asyncckpt.jax.checkpoint_scan: lax.scan's values and gradients (the carry's and xs's bit for
bit, the closed-over arrays' within a few ulps), carries through a real Level-2, under jax.jit
and jax.grad, and clear errors for bad input and failing storage."""
from __future__ import annotations

import numpy as np
import pytest

# jax.numpy, not jax: without JAX, tests/test_asyncckpt/jax imports as a namespace "jax"

pytest.importorskip("jax.numpy")

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from conftest import wait_no_threads  # noqa: E402
from faults import FaultyMixin  # noqa: E402

from asyncckpt import FileStorage  # noqa: E402
from asyncckpt.jax import checkpoint_scan, last_plan, last_stats, plan_scan  # noqa: E402

jax.config.update("jax_enable_x64", True)

#: Where ``lax.scan``'s forward differs differentiated or not (XLA fusing a function apart from
#: its neighbours), the checkpointed gradients follow the plain forward's carries: within these
#: ulps of the largest entry. Elsewhere every gradient is ``lax.scan``'s bit for bit, the
#: closed-over arrays' sums too (each step's part added to the running sum from the last).
PARAM_RTOL = {np.float64: 1e-13, np.float32: 1e-5}


class FailingFile(FaultyMixin, FileStorage):
    pass


def rnn(dtype, n: int, hidden: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    W = jnp.asarray(rng.standard_normal((hidden, hidden)) * 0.3, dtype)
    U = jnp.asarray(rng.standard_normal((hidden, hidden)) * 0.3, dtype)
    xs = jnp.asarray(rng.standard_normal((n, 4, hidden)), dtype)
    h0 = jnp.asarray(rng.standard_normal((4, hidden)), dtype)
    return W, U, xs, h0


def loss_with(scan, **kwargs):
    def loss(W, U, h0, xs):
        def step(carry, x):
            h, c = carry["h"], carry["c"]
            h_new = jnp.tanh(h @ W + x @ U + 0.1 * c)
            return {"h": h_new, "c": 0.5 * c + h_new}, jnp.sum(h_new ** 2, axis=-1)
        final, ys = scan(step, {"h": h0, "c": jnp.zeros_like(h0)}, xs, **kwargs)
        return jnp.sum(final["h"]) + jnp.sum(final["c"] ** 2) + jnp.sum(ys * ys)
    return loss


def assert_gradients_match(ours, reference, dtype) -> None:
    (gW, gU, gh, gx), (rW, rU, rh, rx) = ours, reference
    assert np.asarray(gh).tobytes() == np.asarray(rh).tobytes()  # the carry's: bit for bit
    assert np.asarray(gx).tobytes() == np.asarray(rx).tobytes()  # xs's: bit for bit
    for ours_p, ref_p in ((gW, rW), (gU, rU)):  # the closed-over arrays' sums: bit for bit
        assert ours_p.dtype == ref_p.dtype
        assert np.asarray(ours_p).tobytes() == np.asarray(ref_p).tobytes()


def lax_scan_differs_when_differentiated(step, carry, length: int) -> bool:
    """Whether ``lax.scan``'s forward under ``jax.vjp`` reaches another final carry than its plain
    forward. XLA may compile a function whose result is also kept for the backward apart from
    its neighbours, and its bits then differ (jaxlib 0.12.0.1's CPU ``tanh``: fused or not, an
    ulp apart); the checkpointed carries are the plain forward's, so the gradients follow them."""
    def scan(c):
        return jax.lax.scan(step, c, length=length)[0]
    return np.asarray(scan(carry)).tobytes() != np.asarray(jax.vjp(scan, carry)[0]).tobytes()


def assert_gradient_as_lax_scan(ours, reference, bit_for_bit: bool) -> None:
    """A gradient: ``lax.scan``'s bit for bit where its forward is the same
    differentiated or not, else within the few ulps the two forwards part by."""
    if bit_for_bit:
        assert np.asarray(ours).tobytes() == np.asarray(reference).tobytes()
    scale = float(jnp.max(jnp.abs(reference)))
    assert float(jnp.max(jnp.abs(ours - reference))) <= PARAM_RTOL[np.float64] * scale


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n, interval", [(1, "auto"), (37, 1), (37, 5), (37, 37), (200, "auto"),
                                         (200, 64)])
def test_gradients_are_those_of_lax_scan_under_jit(dtype, n: int, interval) -> None:
    W, U, xs, h0 = rnn(dtype, n)
    reference = jax.grad(loss_with(jax.lax.scan), argnums=(0, 1, 2, 3))(W, U, h0, xs)
    ours = jax.jit(jax.grad(loss_with(checkpoint_scan, interval=interval,
                                      memory_budget="128KiB"), argnums=(0, 1, 2, 3)))
    for _ in range(2):  # a second call of the compiled program runs anew
        assert_gradients_match(ours(W, U, h0, xs), reference, dtype)
        stats = last_stats()
        assert stats is not None and stats.reverse_steps == stats.n_timesteps
    values = loss_with(checkpoint_scan, interval=interval)(W, U, h0, xs)
    assert np.asarray(values).tobytes() == \
        np.asarray(loss_with(jax.lax.scan)(W, U, h0, xs)).tobytes()
    assert wait_no_threads() == []


def test_segments_recomputed_in_chunks_without_xs_match_lax_scan() -> None:
    """``length`` without ``xs``, segments of 62 recomputed in chunks (24 KiB holds a few steps'
    residuals), the last segment and the last chunk of each shorter (62 = 2 x 31: no chunk from
    3 to 30 divides it, whatever a step's residuals; jax 0.12's lead to 4, which divides 64)."""
    W = jnp.asarray(np.random.default_rng(0).standard_normal((32, 32)) * 0.2)

    def loss(scan, **kwargs):
        def f(c0, W):
            final, ys = scan(lambda c, _: (jnp.tanh(c @ W), jnp.sum(c)), c0, length=200,
                             **kwargs)
            return jnp.sum(final) + jnp.sum(ys)
        return f

    c0 = jnp.ones((4, 32))
    ours = jax.jit(jax.grad(loss(checkpoint_scan, interval=62, memory_budget="96KiB"),
                            argnums=(0, 1)))(c0, W)
    plan = last_plan()
    assert plan.n == 200 and plan.interval == 62
    assert plan.chunk > 1 and 62 % plan.chunk and plan.rest
    reference = jax.grad(loss(jax.lax.scan), argnums=(0, 1))(c0, W)
    same = not lax_scan_differs_when_differentiated(
        lambda c, _: (jnp.tanh(c @ W), jnp.sum(c)), c0, 200)
    assert_gradient_as_lax_scan(ours[0], reference[0], bit_for_bit=same)
    assert_gradient_as_lax_scan(ours[1], reference[1], bit_for_bit=same)


@pytest.mark.parametrize("outer", ["scan", "fori_loop"])
def test_inside_a_differentiated_outer_loop_every_iteration_has_its_own_run(outer) -> None:
    """checkpoint_scan as the body of an outer lax.scan or fori_loop under jax.jit(jax.grad):
    JAX hoists what depends on no loop value out of the loop and drops effects nothing reads,
    which once ran one run for all three iterations and dropped every carry's put."""
    W, U, xs, h0 = rnn(np.float64, 37)

    def loss(scan, **kwargs):
        def f(W, U, h0):
            def body(h, _):
                final, ys = scan(lambda h, x: (jnp.tanh(h @ W + x @ U), jnp.sum(h)), h, xs,
                                 **kwargs)
                return final, jnp.sum(ys)
            if outer == "scan":
                final, sums = jax.lax.scan(body, h0, length=3)
                return jnp.sum(final) + jnp.sum(sums)
            return jnp.sum(jax.lax.fori_loop(0, 3, lambda i, h: body(h, None)[0], h0))
        return f

    ours = jax.jit(jax.grad(loss(checkpoint_scan, interval=5), argnums=(0, 1, 2)))(W, U, h0)
    reference = jax.grad(loss(jax.lax.scan), argnums=(0, 1, 2))(W, U, h0)
    for got, want in zip(ours, reference):  # W's and U's sums too
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert wait_no_threads() == []


def test_a_carry_at_a_fixed_point_is_not_taken_for_rebound_arrays() -> None:
    """Segments that leave the carry exactly as it was (1 is a fixed point of c -> 0.5 c + 0.5):
    the adapter's operator updates in place, so the checkpointer does not refuse it."""
    def loss(scan):
        def f(c0):
            final, ys = scan(lambda c, _: (0.5 * c + 0.5, jnp.sum(c * c0)), c0, length=20,
                             **({} if scan is jax.lax.scan else {"interval": 4}))
            return jnp.sum(final) + jnp.sum(ys)
        return f
    c0 = jnp.ones(8)
    ours, reference = jax.grad(loss(checkpoint_scan))(c0), jax.grad(loss(jax.lax.scan))(c0)
    assert np.asarray(ours).tobytes() == np.asarray(reference).tobytes()


def test_a_carry_of_mixed_dtypes_and_shapes_crosses_the_callbacks_bit_for_bit() -> None:
    """float64, float32, bfloat16 and complex128 leaves, a scalar among them, packed into the
    one array a callback takes (``wire``) and unpacked on the host, kept by the checkpointer
    as one buffer of bytes (its arrays share a dtype): the carry's gradient as lax.scan's,
    bit for bit."""
    from asyncckpt.jax import wire
    rng = np.random.default_rng(2)
    carry = {"a": jnp.asarray(rng.standard_normal((3, 5))),
             "b": jnp.asarray(rng.standard_normal(7), jnp.float32),
             "h": jnp.asarray(rng.standard_normal(3), jnp.bfloat16),  # 6 bytes: padded
             "s": jnp.asarray(0.5),
             "z": jnp.asarray(rng.standard_normal(4) + 1j * rng.standard_normal(4))}
    leaves = jax.tree_util.tree_leaves(carry)
    packed = np.asarray(jax.jit(wire.pack)(7, 3, leaves))
    key, segment, unpacked = wire.unpack(packed, [leaf.shape for leaf in leaves],
                                         [str(leaf.dtype) for leaf in leaves])
    assert (key, segment) == (7, 3)
    assert [u.tobytes() for u in unpacked] == [np.asarray(leaf).tobytes() for leaf in leaves]
    with pytest.raises(ValueError, match="expected"):
        wire.unpack(packed[:-1], [leaf.shape for leaf in leaves],
                    [str(leaf.dtype) for leaf in leaves])

    def step(c, _):
        return {"a": jnp.sin(c["a"]) * c["s"], "b": c["b"] * 0.9 + 0.1,
                "h": (c["h"] * 0.5).astype(jnp.bfloat16), "s": c["s"] * 1.01,
                "z": c["z"] * (0.9 + 0.1j)}, jnp.sum(c["a"])

    def loss(scan, **kwargs):
        def f(c0):
            final, ys = scan(step, c0, length=30, **kwargs)
            return (sum(jnp.sum(jnp.abs(leaf.astype(jnp.complex128)) ** 2)
                        for leaf in jax.tree_util.tree_leaves(final)) + jnp.sum(ys))
        return f
    ours = jax.jit(jax.grad(loss(checkpoint_scan, interval=4)))(carry)
    reference = jax.grad(loss(jax.lax.scan))(carry)
    for got, want in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(reference)):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert wait_no_threads() == []


def test_carries_go_through_level2_on_disk_within_the_budget(tmp_path) -> None:
    """64 KiB carries, 400 steps, a 1 MiB budget: the carries beyond it are written to files
    under the path given, read back in reverse order, and the files are gone afterwards."""
    rng = np.random.default_rng(1)
    A = jnp.asarray(rng.standard_normal((8, 8)) * 0.2)
    u0 = jnp.asarray(rng.standard_normal((1024, 8)))

    def loss(A, u0):
        def step(u, _):
            u = u + 0.01 * jnp.tanh(u @ A)
            return u, None
        final, ys = checkpoint_scan(step, u0, length=400, memory_budget="1MiB",
                                    storage=tmp_path / "level2")
        assert ys is None
        return jnp.sum(final ** 2)

    def plain(A, u0):
        final, _ = jax.lax.scan(lambda u, _: (u + 0.01 * jnp.tanh(u @ A), None), u0,
                                length=400)
        return jnp.sum(final ** 2)

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(A, u0)
    want = jax.grad(plain, argnums=(0, 1))(A, u0)
    same = not lax_scan_differs_when_differentiated(
        lambda u, _: (u + 0.01 * jnp.tanh(u @ A), None), u0, 400)
    assert_gradient_as_lax_scan(got[1], want[1], bit_for_bit=same)
    assert_gradient_as_lax_scan(got[0], want[0], bit_for_bit=same)
    stats = last_stats()
    assert stats.l2_writes > 0 and stats.l2_reads == stats.l2_writes
    # the next scan's plan prices a carry's write at the rate this run measured
    from asyncckpt.jax.host import RUNS
    assert RUNS.write_bps == stats.bytes_written / stats.write_busy_s
    assert not list((tmp_path / "level2").glob("**/*.*"))
    assert wait_no_threads() == []


def test_a_codec_under_a_tight_budget_keeps_every_carry_on_level2() -> None:
    """A codec holds more buffers per I/O thread: the plan once left the checkpointer's
    budget a buffer short, it fell back to Revolve in Level-1, advanced several segments in one
    call and the forward's put waited for ever. Now the budget counts them (lossless: bitwise);
    the checkpointer takes 36 KiB at the least, nine buffers of a page (the carry, two staging,
    two prefetch, and the I/O thread's buffer and the codec's three work buffers), beside the
    26400 bytes the scan holds for a segment's backward (asyncckpt.jax.held)."""
    def loss(scan, **kwargs):
        def f(c0):
            final, ys = scan(lambda c, x: (jnp.tanh(c + x), jnp.sum(c)), c0,
                             jnp.ones((40, 300)) * 0.1, **kwargs)
            return jnp.sum(final) + jnp.sum(ys)
        return f
    pytest.importorskip("blosc2")
    ours = jax.grad(loss(checkpoint_scan, interval=4, memory_budget=36 * 1024 + 26400,
                         compression="lz4"))(jnp.zeros(300))
    assert np.asarray(ours).tobytes() == \
        np.asarray(jax.grad(loss(jax.lax.scan))(jnp.zeros(300))).tobytes()
    stats = last_stats()
    assert stats.interval == 1 and stats.l2_writes == 10 and stats.encoded_states == 10
    assert wait_no_threads() == []


def test_a_checkpointer_that_would_advance_several_segments_at_once_fails_not_waits() -> None:
    """The host run's safety net: a checkpointer whose budget leaves no room for Level-2 runs
    Revolve in its slots, advancing several segments in one call, which XLA cannot serve: the
    forward sweep fails and the next put raises (instead of waiting for a taker)."""
    from asyncckpt.errors import CheckpointError
    from asyncckpt.jax.host import HostRun
    run = HostRun([(300,)], ["float64"], 10, {"memory_budget": 2 * 4096})
    with pytest.raises(CheckpointError, match="advance segments 0 to [2-9] in one call"):
        for segment in range(10):
            run.put(segment, [np.full(300, float(segment))])
    run.abort(CheckpointError("test over"))
    assert wait_no_threads() == []


def test_plan_keeps_a_segments_backward_within_the_budget() -> None:
    # sqrt(n) steps, hiding the write behind them, at most what three quarters of the budget
    # holds of steps' residuals, or the carries alone where not one step's fits
    interval, remat, rest = plan_scan(10000, 1 << 10, 3 << 10, 1e-3, memory_budget=1 << 20)
    assert (interval, remat) == (100, False) and rest == (1 << 20) - 100 * (4 << 10)
    interval, _, _ = plan_scan(10000, 1 << 10, 3 << 10, 1e-3, memory_budget=200 << 10)
    assert interval == (150 << 10) // (4 << 10)
    interval, _, _ = plan_scan(10000, 1 << 20, 0, 1e-6, memory_budget=1 << 40)
    assert interval > 100  # a write of 1 MiB hidden behind steps of a microsecond
    _, remat, _ = plan_scan(10000, 1 << 10, 1 << 20, 1e-3, memory_budget=256 << 10)
    assert remat
    # a given interval: residuals stored where they fit the share, else recomputed in chunks
    assert plan_scan(10000, 1 << 10, 3 << 10, None, memory_budget=1 << 20,
                     interval=100) == (100, False, (1 << 20) - 100 * (4 << 10))
    interval, chunk, rest = plan_scan(10000, 1 << 10, 3 << 10, None, memory_budget=1 << 20,
                                      interval=400)
    # in chunks of about sqrt(400 x 2 KiB / 4 KiB) = 14 steps; 13 holds as little: 31 carries
    # kept (2 KiB each, with their cotangents) and 12 steps' residuals beyond one step's
    assert (interval, chunk) == (400, 13) and rest == (1 << 20) - 31 * (2 << 10) - 12 * (4 << 10)


def test_plan_recomputes_in_chunks_where_the_budget_holds_few_steps_residuals() -> None:
    # 2 KiB carries (4 KiB kept, with a cotangent), 40 KiB of residuals a step, 0.1 ms
    # steps, 96 KiB for a segment's backward: 2 steps' residuals, or 24 steps keeping a carry
    # each, or longer segments recomputed in chunks
    interval, chunk, _ = plan_scan(100_000, 2 << 10, 40 << 10, 1e-4, memory_budget=128 << 10)
    assert chunk > 1
    kept, stored = 2 * (2 << 10), 42 << 10
    assert -(-interval // chunk) * kept + (chunk - 1) * stored <= 96 << 10
    assert interval > (96 << 10) // kept  # longer than a carry kept per step allows


@pytest.mark.parametrize("returns, message", [
    (lambda h, x: ((h, h), None), "structure"),
    (lambda h, x: (h[:2], None), "shape"),
    (lambda h, x: (h.astype(jnp.float32), None), "dtype float32"),
])
def test_a_step_returning_another_carry_is_refused_naming_it(returns, message) -> None:
    with pytest.raises(ValueError, match=message):
        checkpoint_scan(returns, jnp.zeros(3), jnp.zeros((5, 3)))


def test_bad_inputs_get_errors_that_name_them() -> None:
    step = lambda h, x: (h + x, None)  # noqa: E731
    with pytest.raises(ValueError, match="length=4 but xs hold 5"):
        checkpoint_scan(step, jnp.zeros(3), jnp.zeros((5, 3)), length=4)
    with pytest.raises(ValueError, match="share their first dimension"):
        checkpoint_scan(step, jnp.zeros(3), (jnp.zeros((5, 3)), jnp.zeros((4, 3))))
    with pytest.raises(TypeError, match=r"carry leaf \[1\] is a str"):
        checkpoint_scan(step, (jnp.zeros(3), "h"), jnp.zeros((5, 3)))
    with pytest.raises(TypeError, match="must be floating"):
        checkpoint_scan(step, jnp.zeros(3, jnp.int32), jnp.zeros((5, 3), jnp.int32))
    with pytest.raises(ValueError, match="needs n >= 1"):
        checkpoint_scan(step, jnp.zeros(3))
    with pytest.raises(ValueError, match="interval must be 'auto' or an int >= 1"):
        checkpoint_scan(step, jnp.zeros(3), jnp.zeros((5, 3)), interval=0)
    # refused while tracing, not in the callback that would make the checkpointer
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['unroll'\] \(lax.scan's unroll"):
        jax.make_jaxpr(lambda c: checkpoint_scan(step, c, jnp.zeros((5, 3)), unroll=2))(
            jnp.zeros(3))
    with pytest.raises(ValueError, match=r"\['io_thread'\].*'io_threads'"):
        checkpoint_scan(step, jnp.zeros(3), jnp.zeros((5, 3)), io_thread=2)
    with pytest.raises(ValueError, match="compression must be None, 'auto'.*got 'bogus'"):
        jax.make_jaxpr(lambda c: checkpoint_scan(step, c, jnp.zeros((5, 3)),
                                                 compression="bogus"))(jnp.zeros(3))
    # the checkpointer's interval is 1: nothing for "auto" to decide
    with pytest.raises(ValueError, match="compression='auto'.*name a codec"):
        checkpoint_scan(step, jnp.zeros(3), jnp.zeros((5, 3)), compression="auto")
    pytest.importorskip("zfpy")
    mixed = (jnp.zeros(3, jnp.float32), jnp.zeros(3))
    with pytest.raises(ValueError, match=r"dtypes \['float32', 'float64'\], kept as bytes.*zfp"):
        checkpoint_scan(lambda c, x: (c, None), mixed, jnp.zeros((5, 3)),
                        compression={"codec": "zfp", "tolerance": 1e-6})


def test_reverse_runs_the_steps_from_the_last_as_lax_scan_does() -> None:
    W, U, xs, h0 = rnn(np.float64, 37)
    ours = jax.jit(jax.grad(loss_with(checkpoint_scan, interval=5, reverse=True),
                            argnums=(0, 1, 2, 3)))(W, U, h0, xs)
    reference = jax.grad(loss_with(jax.lax.scan, reverse=True), argnums=(0, 1, 2, 3))(
        W, U, h0, xs)
    assert_gradients_match(ours, reference, np.float64)
    values = loss_with(checkpoint_scan, interval=5, reverse=True)(W, U, h0, xs)
    assert np.asarray(values).tobytes() == \
        np.asarray(loss_with(jax.lax.scan, reverse=True)(W, U, h0, xs)).tobytes()


def test_ctrl_c_during_a_compiled_gradient_reaches_the_caller_and_leaves_nothing(
        tmp_path) -> None:
    """SIGINT half a second into a long differentiated scan: the call raises at once (JAX's
    runtime error around the KeyboardInterrupt a callback took), and end_open_runs() lets go
    of the run it left: no thread, no file."""
    import subprocess
    import sys

    program = f"""
import os, signal, sys, threading, time
import jax, jax.numpy as jnp
from asyncckpt.jax import checkpoint_scan, end_open_runs
signal.signal(signal.SIGINT, signal.default_int_handler)
def loss(u0):
    f, _ = checkpoint_scan(lambda u, _: (jnp.sin(u) * 1.0001, None), u0, length=200000,
                           interval=50, memory_budget="1MiB", storage={str(tmp_path)!r})
    return jnp.sum(f)
grad = jax.jit(jax.grad(loss))
grad(jnp.ones(4096)).block_until_ready()
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    grad(jnp.ones(4096)).block_until_ready()
except (KeyboardInterrupt, Exception) as exc:
    print("raised", "KeyboardInterrupt" in repr(exc) or isinstance(exc, KeyboardInterrupt))
print("seconds", time.monotonic() - start)
end_open_runs()
print("threads", [t.name for t in threading.enumerate()
                 if t.name.startswith("asyncckpt") and t.name != "asyncckpt-reaper"])
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines.get("raised") == "True", done.stderr[-2000:]
    assert float(lines["seconds"]) < 5
    assert lines["threads"] == "[]"
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_failing_level2_reaches_the_caller_and_leaves_no_thread_or_file(tmp_path) -> None:
    storage = FailingFile(tmp_path / "failing", fail_put_at=3)

    def loss(u0):
        final, _ = checkpoint_scan(lambda u, _: (jnp.sin(u) * 1.01, None), u0, length=50,
                                   interval=5, storage=storage, memory_budget="640KiB")
        return jnp.sum(final)

    with pytest.raises(Exception, match="TransferError|failed"):
        jax.block_until_ready(jax.jit(jax.grad(loss))(jnp.ones(4096)))
    assert wait_no_threads() == []
    storage.close()
    assert not list((tmp_path / "failing").glob("*"))



@pytest.mark.parametrize("budget", [16, 8192])
def test_a_budget_below_one_carry_and_the_engines_buffers_is_refused(budget: int) -> None:
    """A 64-byte carry under memory_budget="16" ran (the checkpointer was given more than the
    budget: a carry and its transfer buffers at the least), where numpy refuses it with this
    error; two carries' pages are refused too: the scan cannot run Revolve in Level-1 alone."""
    from workloads import Forward, RecurrentCell, Reverse

    from asyncckpt import AsyncCheckpointer

    def f(c0):
        return jnp.sum(checkpoint_scan(lambda c, _: (c * 1.01, None), c0, length=10,
                                       memory_budget=str(budget))[0])
    refused = f"memory_budget of {budget} bytes is too small for"
    with pytest.raises(ValueError, match=refused):
        jax.grad(f)(jnp.ones(8))
    if budget < 4096:  # numpy's refusal, the same error
        model = RecurrentCell(10)
        with pytest.raises(ValueError, match=refused):
            AsyncCheckpointer(model, Forward(model), Reverse(model), 10, memory_budget=budget)
