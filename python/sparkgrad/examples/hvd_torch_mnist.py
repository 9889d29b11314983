"""Horovod's PyTorch MNIST example, run by sparkgrad: ``python -m sparkgrad.examples.hvd_torch_mnist``.

The program has the shape of Horovod's ``examples/pytorch/pytorch_mnist.py``
(its model of two convolutions and two fully connected layers, SGD with the
learning rate scaled by the number of ranks, the parameters and optimizer
state broadcast from rank 0, ``hvd.DistributedOptimizer``, a
``DistributedSampler`` per rank, metrics averaged with ``hvd.allreduce``)
with three changes only:

* ``import sparkgrad.hvd.torch as hvd`` instead of ``import horovod.torch as hvd``;
* the data: Debian's Fashion-MNIST IDX files (sparkgrad.data.idx) instead of
  torchvision's download of MNIST;
* ``sparkgrad.run(train, num_proc=N)`` instead of ``horovodrun -np N``.

    python -m sparkgrad.examples.hvd_torch_mnist --num-proc 2 --epochs 1
"""

from __future__ import annotations

import argparse
from typing import Any


def train(
    train_rows: int | None = None, test_rows: int | None = 2000, batch_size: int = 64, epochs: int = 1,
    lr: float = 0.01, momentum: float = 0.5, seed: int = 42, fp16_allreduce: bool = False,
    gradient_predivide_factor: float = 1.0, log_interval: int = 10,
) -> dict[str, Any]:  # fmt: skip
    """One rank's training; returns its per-step losses, its final parameters and the averaged test metrics."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - the example's spelling
    import torch.utils.data.distributed

    import sparkgrad.hvd.torch as hvd
    from sparkgrad.data.idx import fashion_mnist

    hvd.init()
    torch.manual_seed(seed)
    torch.set_num_threads(1)

    def dataset(split: str, rows: int | None) -> torch.utils.data.TensorDataset:
        images, labels = fashion_mnist(split)
        x = torch.from_numpy(images[:rows]).float().div_(255).sub_(0.2860).div_(0.3530).unsqueeze(1)
        return torch.utils.data.TensorDataset(x, torch.from_numpy(labels[:rows]).long())

    train_dataset = dataset("train", train_rows)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=batch_size, sampler=train_sampler)
    test_dataset = dataset("test", test_rows)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False
    )
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000, sampler=test_sampler)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
            self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
            self.conv2_drop = torch.nn.Dropout2d()
            self.fc1 = torch.nn.Linear(320, 50)
            self.fc2 = torch.nn.Linear(50, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
            x = F.relu(self.fc1(x.view(-1, 320)))
            x = F.dropout(x, training=self.training)
            return F.log_softmax(self.fc2(x), dim=1)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression, op=hvd.Average,
        gradient_predivide_factor=gradient_predivide_factor,
    )  # fmt: skip

    def metric_average(value: float, name: str) -> float:
        return hvd.allreduce(torch.tensor(value), name=name).item()

    losses = []
    for epoch in range(1, epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if batch_idx % log_interval == 0 and hvd.rank() == 0:
                print(f"epoch {epoch} [{batch_idx * len(data)}/{len(train_sampler)}] loss {loss.item():.4f}")

    model.eval()
    test_loss, correct = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
    accuracy = metric_average(correct / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"test set: average loss {test_loss:.4f}, accuracy {100 * accuracy:.1f}%")
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    return {"losses": losses, "params": params, "test_loss": test_loss, "accuracy": accuracy}


def main(argv: list[str] | None = None) -> None:
    import sparkgrad
    from sparkgrad.examples.hvd_torch_mnist import train as rank_main  # by module name: ranks unpickle it

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--train-rows", type=int, default=None)
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args(argv)
    got = sparkgrad.run(
        rank_main, kwargs=dict(train_rows=args.train_rows, batch_size=args.batch_size, epochs=args.epochs, lr=args.lr,
                           fp16_allreduce=args.fp16_allreduce),
        num_proc=args.num_proc,
    )  # fmt: skip
    print(f"accuracy {got[0]['accuracy']:.4f} after {len(got[0]['losses'])} steps per rank")


if __name__ == "__main__":
    main()
