"""A torch front end's run in a process of its own, its peak resident memory measured from a
reset once the program's own tensors are resident and torch has paid what it pays once per
process for the model (one plain forward and backward step run before the base): what the
PyTorch budget tests hold against a bound.

The process runs with glibc's mmap threshold fixed at its initial 128 KiB
(``MALLOC_MMAP_THRESHOLD_``): by default glibc raises it to the size of each mapped block freed,
and the pages the plain step frees then stay in malloc's heaps, resident before the base, where
the call reuses them unseen (a stack of 4 MiB activations grew 22 MiB under a 52 MiB budget
measured so, 50 MiB with the threshold fixed).

Two workloads, each built from a seed, so a run is the same in every process:

- ``"gru"``: ``checkpoint_scan`` over a GRU language model (embedding, ``GRUCell``, linear
  head; each step returns its loss), n steps of a batch of token ids.
- ``"cnn"``: ``checkpoint_sequential`` over a stack of 3x3 convolutions and ReLUs, every
  activation ``batch x channels x size x size`` float32.
- ``"mlp"``: ``checkpoint_sequential`` over ``depth`` pairs of ``Linear(width, width)`` and
  ``Tanh``, activations ``batch x width`` float32.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

__all__ = ["run_torch_in_process"]

_RUN = r"""
import json, sys, time
import torch
import asyncckpt.torch as at
from experiments.lstm.worker import peak_rss_bytes, reset_peak_rss

w = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(w.get("threads", 1))
if w["workload"] == "gru":
    vocab, hidden, batch, n = w["vocab"], w["hidden"], w["batch"], w["n"]
    embed = torch.nn.Embedding(vocab, hidden)
    cell = torch.nn.GRUCell(hidden, hidden)
    head = torch.nn.Linear(hidden, vocab)
    params = [*embed.parameters(), *cell.parameters(), *head.parameters()]
    tokens = torch.randint(vocab, (n + 1, batch))
    xs = (tokens[:-1], tokens[1:])
    h0 = torch.zeros(batch, hidden)

    def step(h, x):
        h = cell(embed(x[0]), h)
        return h, torch.nn.functional.cross_entropy(head(h), x[1])

    def one_step():  # torch's own: one plain forward and backward step of the model
        step(h0, (tokens[0], tokens[1]))[1].backward()

    def run(plain=False):
        if plain:
            h, losses = h0, []
            for t in range(n):
                h, loss = step(h, (xs[0][t], xs[1][t]))
                losses.append(loss)
            losses = torch.stack(losses)
        else:
            _, losses = at.checkpoint_scan(step, h0, xs, **w["options"])
        losses.sum().backward()
else:
    batch, depth = w["batch"], w["depth"]
    layers = []
    for _ in range(depth):
        layers += ([torch.nn.Linear(w["width"], w["width"]), torch.nn.Tanh()]
                   if w["workload"] == "mlp" else
                   [torch.nn.Conv2d(w["channels"], w["channels"], 3, padding=1),
                    torch.nn.ReLU()])
    net = torch.nn.Sequential(*layers)
    params = list(net.parameters())
    x = (torch.randn(batch, w["width"]) if w["workload"] == "mlp"
         else torch.randn(batch, w["channels"], w["size"], w["size"]))

    def one_step():  # torch's own: one plain forward and backward step of the model (its
        net(x).sum().backward()  # convolutions' first gradient of an input: 36 MiB, once)

    def run(plain=False):
        out = net(x) if plain else at.checkpoint_sequential(net, x, **w["options"])
        out.sum().backward()

if w.get("torch_first", True):
    one_step()
# the program's own tensors resident, the parameters' gradients among them
for p in params:
    p.grad = torch.zeros_like(p)
report = {"calls": []}
for call in range(w.get("calls", 1)):
    reset_peak_rss()
    base = peak_rss_bytes()
    try:
        run(plain=w.get("plain", False))
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {error}"
        break
    report["calls"].append(peak_rss_bytes() - base)
    if call == 0:
        if w.get("grads_path"):
            torch.save([p.grad.clone() for p in params], w["grads_path"])
        stats = at.last_stats()
        if stats is not None:
            report["stats"] = {k: getattr(stats, k) for k in
                               ("interval", "l1_peak_slots", "l2_writes", "forward_steps")}
    for p in params:
        p.grad.zero_()
print(json.dumps(report))
"""


def run_torch_in_process(workload: str, *, options: dict | None = None, calls: int = 1,
                         plain: bool = False, torch_first: bool = True,
                         grads_path: str | None = None, **sizes: int) -> dict:
    """Run ``workload`` (``"gru"``: ``vocab``, ``hidden``, ``batch``, ``n``; ``"cnn"``:
    ``batch``, ``channels``, ``size``, ``depth``; ``"mlp"``: ``batch``, ``width``, ``depth``) ``calls`` times in a fresh process, each a
    forward and backward through the front end with ``options`` (or plain autograd where
    ``plain``), after one plain step of the model where ``torch_first``, and return its report: ``calls``, each call's peak resident growth in bytes
    from a reset just before it; ``stats``, the first call's; ``error``, what a call raised.
    The parameters' gradients of the first call go to ``grads_path`` (``torch.save``)."""
    spec = {"workload": workload, "options": options or {}, "calls": calls, "plain": plain,
            "torch_first": torch_first, "grads_path": grads_path, **sizes}
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(spec)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)})
    if done.returncode != 0:
        raise AssertionError(f"the {workload} process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
