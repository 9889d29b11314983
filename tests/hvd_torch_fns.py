"""Rank functions of tests/test_hvd_torch.py: what each rank of a sparkgrad.run does with sparkgrad.hvd.torch.

Each rank imports torch itself (the test process may not have); values come
back by pickle through the launcher, tensors as NumPy arrays.
"""

from __future__ import annotations

import os
import signal


def _setup():
    import sparkgrad.hvd.torch as hvd
    import torch

    torch.set_num_threads(1)  # two ranks share this machine's cores
    hvd.init()
    return torch, hvd


def collectives():
    """Every collective of hvd.torch on this rank, with its inputs, for the test to recompute."""
    torch, hvd = _setup()
    r = hvd.rank()
    x = torch.linspace(-2, 2, 12).reshape(3, 4) * (r + 1) + r
    out = {"x": x.numpy().copy()}
    out["avg"] = hvd.allreduce(x, name="x").numpy()
    out["sum"] = hvd.allreduce(x, op=hvd.Sum).numpy()
    out["min"] = hvd.allreduce(x, op=hvd.Min).numpy()
    out["max"] = hvd.allreduce(x, op=hvd.Max).numpy()
    out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0).numpy()
    inplace = x.clone()
    storage = inplace.data_ptr()
    back = hvd.allreduce_(inplace, op=hvd.Sum)
    out["inplace"] = inplace.numpy()
    out["inplace_same_storage"] = back is inplace and inplace.data_ptr() == storage
    strided = x.clone().t()  # not contiguous: reduced through a copy, written back
    hvd.allreduce_(strided, op=hvd.Sum)
    out["strided"] = strided.numpy().copy()
    handles = [hvd.allreduce_async(x * k, op=hvd.Sum, name=f"async.{k}") for k in range(3)]
    out["async"] = [hvd.synchronize(h).numpy() for h in handles]
    h = hvd.allreduce_async_(x.clone(), op=hvd.Sum)
    out["async_"] = hvd.synchronize(h).numpy()
    out["polled"] = hvd.poll(hvd.allreduce_async(x)) in (True, False)
    out["half"] = hvd.allreduce(x.half(), op=hvd.Sum).float().numpy()
    out["bf16"] = hvd.allreduce(x.bfloat16(), op=hvd.Sum).float().numpy()
    out["ints"] = hvd.allreduce(torch.arange(5, dtype=torch.int32) * (r + 1), op=hvd.Sum).numpy()
    out["fp16"] = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16).numpy()
    out["bf16wire"] = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.bf16).numpy()
    group = hvd.grouped_allreduce([x, x.double() * 2, torch.tensor([r + 1])], op=hvd.Sum)
    out["grouped"] = [t.numpy() for t in group]
    out["grouped_dtypes"] = [str(t.dtype) for t in group]
    out["gather"] = hvd.allgather(torch.full((r + 1, 2), float(r))).numpy()
    out["gather_bf16"] = hvd.allgather(torch.full((1, 2), r + 0.5, dtype=torch.bfloat16)).float().numpy()
    out["bcast"] = hvd.broadcast(x, root_rank=1).numpy()
    y = x.clone()
    hvd.broadcast_(y, root_rank=0)
    out["bcast_"] = y.numpy()
    out["a2a_even"] = hvd.alltoall(torch.arange(4) + 10 * r).numpy()
    got, received = hvd.alltoall(torch.arange(4) + 10 * r, splits=[1, 3] if r == 0 else [2, 2])
    out["a2a"], out["a2a_received"] = got.numpy(), received.tolist()
    obj = hvd.broadcast_object({"r": r, "t": torch.full((2,), float(r)), "s": "text"}, root_rank=1)
    out["obj"] = {"r": obj["r"], "t": obj["t"].numpy(), "s": obj["s"]}
    out["objs"] = hvd.allgather_object([r, {"k": r * 1.5}])
    # async and sync interleaved: the ring runs them in the order they were issued, whatever the order of waiting
    first = hvd.allreduce_async(torch.full((2,), float(r)), op=hvd.Sum, name="first")
    middle = hvd.allreduce(torch.full((2,), 10.0 * r), op=hvd.Sum, name="middle")
    last = hvd.allgather_async(torch.tensor([r]), name="last")
    out["interleaved"] = [hvd.synchronize(last).numpy(), middle.numpy(), hvd.synchronize(first).numpy()]
    # a model with an integer buffer, and optimizer state only rank 0 has
    torch.manual_seed(20 + r)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    if r == 0:
        model(torch.randn(4, 3)).sum().backward()
        opt.step()  # momentum buffers and BatchNorm's running statistics on rank 0 only
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    out["state_dict"] = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    out["momentum"] = [opt.state[p]["momentum_buffer"].numpy().copy() for p in model.parameters()]
    out["lr"] = opt.param_groups[0]["lr"]
    w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (hvd.allreduce(w, op=hvd.Sum, name="w") * (r + 1)).sum().backward()  # d/dw of sum_r (r+1) * sum(w_0 + w_1)
    out["grad_allreduce"] = w.grad.numpy().copy()
    v = torch.full((r + 1, 2), 1.0, requires_grad=True)
    gathered = hvd.allgather(v, name="v")  # rows: rank 0's one, then rank 1's two
    (gathered * torch.arange(3.0).reshape(3, 1) * (r + 1)).sum().backward()
    out["grad_allgather"] = v.grad.numpy().copy()
    u = torch.ones(2, requires_grad=True)
    (hvd.broadcast(u, root_rank=1, name="u") * (r + 2)).sum().backward()
    out["grad_broadcast"] = u.grad.numpy().copy()
    hvd.barrier()
    return out


def _net(torch, seed=0, hidden=16):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
        torch.nn.Linear(hidden, 3),
    )  # fmt: skip


def _data(torch, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def several_named(calls, keys):
    """Runs each (function name, args, kwargs) of ``calls`` in turn on one ring; their values under ``keys``.

    One run serves several tests: each rank's start-up (importing torch) costs seconds.
    """
    return {key: globals()[name](*args, **kwargs) for key, (name, args, kwargs) in zip(keys, calls, strict=True)}


def gradients(threshold):
    """Per compression: this rank's local gradients and the reduced ones; the buckets and the check's cost."""
    os.environ["HOROVOD_FUSION_THRESHOLD"] = str(threshold)
    torch, hvd = _setup()
    r = hvd.rank()
    x, y = _data(torch, 32, seed=100 + r)
    out = {}
    variants = {
        "none": {},
        "fp16": {"compression": hvd.Compression.fp16},
        "bf16": {"compression": hvd.Compression.bf16},
        "groups": {"groups": 2},  # [0.weight, 0.bias, 2.weight] and [2.bias, 4.weight, 4.bias]
        "predivide": {"gradient_predivide_factor": 4.0},
    }
    for comp, options in variants.items():
        model = _net(torch, seed=1)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), **options
        )
        torch.nn.functional.cross_entropy(model(x), y).backward()
        local = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        buckets = len(opt._pending)  # queued by the hooks while backward ran
        opt.synchronize()
        reduced = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        with opt.skip_synchronize():
            opt.step()
        params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        out[comp] = {"local": local, "reduced": reduced, "params": params, "buckets_during_backward": buckets}
    out["descriptor_seconds"] = hvd.descriptor_seconds()
    del os.environ["HOROVOD_FUSION_THRESHOLD"]
    return out


def train_steps(global_batch, steps, lr, backward_passes_per_step=1):
    """Trains _net on this rank's half of each global batch; returns the final parameters."""
    torch, hvd = _setup()
    r, n = hvd.rank(), hvd.size()
    x, y = _data(torch, global_batch * steps, seed=7)
    model = _net(torch, seed=2 + r)  # different on each rank until broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), backward_passes_per_step=backward_passes_per_step
    )
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    per_pass = global_batch // n // backward_passes_per_step
    for s in range(steps):
        mine = slice(s * global_batch + r * global_batch // n, s * global_batch + (r + 1) * global_batch // n)
        xb, yb = x[mine], y[mine]
        opt.zero_grad()
        for k in range(backward_passes_per_step):
            part = slice(k * per_pass, (k + 1) * per_pass)
            torch.nn.functional.cross_entropy(model(xb[part]), yb[part]).div(backward_passes_per_step).backward()
        opt.step()
    return {n_: p.detach().numpy().copy() for n_, p in model.named_parameters()}


def mismatches():
    """Collectives the ranks call differently: each error's text, then a collective that still works."""
    torch, hvd = _setup()
    r = hvd.rank()
    errors = {}
    cases = {
        "name": lambda: hvd.allreduce(torch.ones(4), name=f"grad.{r}"),
        "shape": lambda: hvd.allreduce(torch.ones(4 + r), name="w"),
        "dtype": lambda: hvd.allreduce(torch.ones(4, dtype=torch.float32 if r == 0 else torch.float64), name="w"),
        "kind": lambda: hvd.allreduce(torch.ones(4), name="w") if r == 0 else hvd.broadcast(torch.ones(4), 0, name="w"),
        "root": lambda: hvd.broadcast(torch.ones(2), root_rank=r, name="b"),
    }
    for case, call in cases.items():
        try:
            call()
            errors[case] = None
        except Exception as exc:  # noqa: BLE001 - the test reads the class and text
            errors[case] = (type(exc).__name__, str(exc), getattr(exc, "collective", None))
    after = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Sum).numpy()
    return {"errors": errors, "after": after}


def join_uneven(batches_by_rank):
    """Rank r trains on batches_by_rank[r] batches, then joins; returns join's value and the reduced gradients."""
    torch, hvd = _setup()
    r = hvd.rank()
    model = _net(torch, seed=3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters())
    x, y = _data(torch, 8 * batches_by_rank[r], seed=30 + r)
    steps = []
    for s in range(batches_by_rank[r]):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[s * 8 : (s + 1) * 8]), y[s * 8 : (s + 1) * 8]).backward()
        local = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.synchronize()
        steps.append({n: (local[n].numpy(), p.grad.numpy().copy()) for n, p in model.named_parameters()})
        with opt.skip_synchronize():
            opt.step()
    last = hvd.join()
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)  # Horovod's recipe: the last to join saw every step
    gathered = hvd.allgather(torch.tensor([float(r)]))  # a collective after join works
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return {"last": last, "steps": steps, "params": params, "gathered": gathered.numpy()}


def raise_mid_step(target, how):
    """Both ranks train; rank ``target`` raises (or is killed) inside its third backward pass."""
    torch, hvd = _setup()
    model = _net(torch, seed=4, hidden=64)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters())
    x, y = _data(torch, 64, seed=5)
    for step in range(200):  # the test expects the run to end at step 2
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if hvd.rank() == target and step == 2:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"rank {target} fails in step {step}")
        loss.backward()
        opt.step()
    return "finished"


def mnist(train_rows, batch_size, epochs, lr):
    """Horovod's pytorch_mnist.py, with sparkgrad.hvd.torch for horovod.torch and Fashion-MNIST IDX files."""
    import torch

    torch.set_num_threads(1)
    from sparkgrad.examples.hvd_torch_mnist import train

    return train(train_rows=train_rows, batch_size=batch_size, epochs=epochs, lr=lr, test_rows=1000, log_interval=1000)


def peer_leaves(leaver):
    """Rank ``leaver`` shuts its communicator down mid-step; the other's step fails: its error and how long it took."""
    import time

    torch, hvd = _setup()
    model = _net(torch, seed=6)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters())
    x, y = _data(torch, 16, seed=8)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    if hvd.rank() == leaver:
        hvd.shutdown()
        return None
    started = time.monotonic()
    try:
        opt.step()
    except Exception as exc:  # noqa: BLE001 - the test reads it
        return {"type": type(exc).__name__, "message": str(exc), "tensor": getattr(exc, "tensor", None),
                "collective": getattr(exc, "collective", None), "seconds": time.monotonic() - started}  # fmt: skip
    return {"type": None}


ALLTOALL_SPLITS = [[1, 0, 2], [2, 2, 1], [0, 3, 1]]  # rows rank r sends to ranks 0, 1, 2


def alltoall_three():
    """On 3 ranks: alltoall with uneven splits, an even one, then one while rank 2 has joined."""
    torch, hvd = _setup()
    r = hvd.rank()
    splits = ALLTOALL_SPLITS[r]
    x = torch.arange(sum(splits) * 2).reshape(-1, 2) + 100 * r
    got, received = hvd.alltoall(x, splits=splits)
    out = {"x": x.numpy(), "got": got.numpy(), "received": received.tolist()}
    out["even"] = hvd.alltoall(torch.arange(6) + 10 * r).numpy()
    if r < 2:  # rank 2 has joined: what the others send it is dropped, it sends nothing
        got, received = hvd.alltoall(torch.arange(3) + 10 * r, splits=[[1, 1, 1], [0, 2, 1]][r])
        out["with_joined"], out["with_joined_received"] = got.numpy(), received.tolist()
    out["last"] = hvd.join()
    return out
