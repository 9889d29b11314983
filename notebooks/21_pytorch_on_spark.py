# Databricks notebook source
# MAGIC %md
# MAGIC # 21 · A PyTorch model on Spark, two ways
# MAGIC
# MAGIC The same PyTorch network (the HorovodRunner tutorial's CNN: two convolutions, two fully connected layers)
# MAGIC trained on `np` ranks twice, from this notebook's cells:
# MAGIC
# MAGIC 1. with Horovod's PyTorch API, `sparkgrad.hvd.torch` (a Horovod program with its import changed), the ranks
# MAGIC    started by `sparkgrad.HorovodRunner`;
# MAGIC 2. as a `torch.distributed` job (DDP over gloo) started by `sparkgrad.torch.Distributor`, which takes
# MAGIC    PySpark's `TorchDistributor` arguments.
# MAGIC
# MAGIC Each returns rank 0's test accuracy and weights; the last cell compares them.
# MAGIC
# MAGIC | widget | meaning |
# MAGIC |---|---|
# MAGIC | `data_path` | TFRecords from `10_prep` (`train*.tfrecords`, `test.tfrecords`) |
# MAGIC | `np` | ranks (> 0 Spark tasks, < 0 processes of the driver) |
# MAGIC | `epochs`, `learning_rate` | SGD with momentum 0.5, the learning rate scaled by the ranks |

# COMMAND ----------

dbutils.widgets.text("data_path", "dbfs:/FileStore/sparkgrad/pipeline/records", "TFRecords")
dbutils.widgets.text("np", "2", "ranks")
dbutils.widgets.text("epochs", "2", "epochs")
dbutils.widgets.text("learning_rate", "0.01", "learning rate")
data_path = dbutils.widgets.get("data_path").rstrip("/")
np_ranks = int(dbutils.widgets.get("np"))
epochs = int(dbutils.widgets.get("epochs"))
learning_rate = float(dbutils.widgets.get("learning_rate"))

# COMMAND ----------

import glob

import numpy as np
from sparkgrad.databricks import fuse_path, require_input

BATCH_SIZE = 32
require_input(dbutils, data_path, "notebooks/10_prep (its output_data) or `sparkgrad convert mnist`")
data = fuse_path(dbutils, data_path)


def get_dataset(data_dir, split, rank=0, size=1):
    """This rank's shard of a split: images float32[N, 1, 28, 28] in [0, 1], labels int64[N]."""
    from sparkgrad.data import FixedLenFeature, RawBytesFeature, TFRecordDataset

    schema = {"image_raw": RawBytesFeature([784], "uint8"), "label": FixedLenFeature([], "int64")}
    files = sorted(glob.glob(f"{data_dir}/{split}*.tfrecords"))
    xs, ys = [], []
    for batch in TFRecordDataset(files, schema, 1000):
        xs.append(batch["image_raw"])
        ys.append(batch["label"])
    x, y = np.concatenate(xs)[rank::size], np.concatenate(ys)[rank::size]
    return (x.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28), y.astype(np.int64)


def make_net():
    """The HorovodRunner tutorial's PyTorch CNN."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
            self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
            self.fc1 = nn.Linear(320, 50)
            self.fc2 = nn.Linear(50, 10)

        def forward(self, x):
            x = torch.relu(torch.max_pool2d(self.conv1(x), 2))
            x = torch.relu(torch.max_pool2d(self.conv2(x), 2))
            return self.fc2(torch.relu(self.fc1(x.flatten(1))))

    return Net()


def fit_epochs(net, optimizer, x, y, epochs, mean_of, rank):
    """The training loop both runs share: epochs over this rank's shard in order, the loss averaged
    over the ranks by mean_of(tensor) at each epoch's end and printed by rank 0."""
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(epochs):
        net.train()
        for s in range(len(x) // BATCH_SIZE):
            xb = torch.from_numpy(x[s * BATCH_SIZE : (s + 1) * BATCH_SIZE])
            yb = torch.from_numpy(y[s * BATCH_SIZE : (s + 1) * BATCH_SIZE])
            optimizer.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
            optimizer.step()
        mean_loss = mean_of(loss.detach())
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {mean_loss:.4f}")


def accuracy(net, x, y):
    import torch

    net.eval()
    with torch.no_grad():
        return float((net(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


# COMMAND ----------

# MAGIC %md
# MAGIC ## 1 · Horovod's API: `sparkgrad.hvd.torch` under `HorovodRunner`

# COMMAND ----------


def train_hvd(data_dir, epochs, learning_rate):
    import sparkgrad.hvd.torch as hvd  # was: import horovod.torch as hvd
    import torch

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x, y = get_dataset(data_dir, "train", hvd.rank(), hvd.size())
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=learning_rate * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=net.named_parameters())
    fit_epochs(net, optimizer, x, y, epochs, lambda t: hvd.allreduce(t, name="loss").item(), hvd.rank())
    if hvd.rank() != 0:
        return None
    x_test, y_test = get_dataset(data_dir, "test")
    return {"test_accuracy": accuracy(net, x_test, y_test), "weights": net.fc2.weight.detach().numpy().copy()}


# COMMAND ----------

import sparkgrad

hvd_result = sparkgrad.HorovodRunner(np=np_ranks).run(
    train_hvd, data_dir=data, epochs=epochs, learning_rate=learning_rate
)
print(f"sparkgrad.hvd.torch: test accuracy {hvd_result['test_accuracy']:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2 · A `torch.distributed` job (DDP over gloo) under `sparkgrad.torch.Distributor`
# MAGIC
# MAGIC The function is what a `TorchDistributor` job runs: `init_process_group` reads everything from the
# MAGIC environment the Distributor set (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK).

# COMMAND ----------


def train_ddp(data_dir, epochs, learning_rate):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x, y = get_dataset(data_dir, "train", rank, size)
    net = DistributedDataParallel(make_net())
    optimizer = torch.optim.SGD(net.parameters(), lr=learning_rate * size, momentum=0.5)

    def mean_of(t):
        dist.all_reduce(t)
        return t.item() / size

    fit_epochs(net, optimizer, x, y, epochs, mean_of, rank)
    result = None
    if rank == 0:
        x_test, y_test = get_dataset(data_dir, "test")
        result = {"test_accuracy": accuracy(net.module, x_test, y_test)}
        result["weights"] = net.module.fc2.weight.detach().numpy().copy()
    dist.destroy_process_group()
    return result


# COMMAND ----------

from sparkgrad.torch import Distributor

ddp_result = Distributor(num_processes=abs(np_ranks), local_mode=np_ranks < 0, use_gpu=False).run(
    train_ddp, data, epochs, learning_rate
)
print(f"sparkgrad.torch.Distributor (DDP): test accuracy {ddp_result['test_accuracy']:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The two runs side by side
# MAGIC
# MAGIC Both start from the same weights (seed 1), see the same shards in the same order and average the same
# MAGIC gradients, so they end close; the order of the floating-point sums differs between the two rings.

# COMMAND ----------

weight_gap = float(np.abs(hvd_result["weights"] - ddp_result["weights"]).max())
summary = {
    "hvd_test_accuracy": hvd_result["test_accuracy"],
    "ddp_test_accuracy": ddp_result["test_accuracy"],
    "max_weight_difference": weight_gap,
}
print(summary)
