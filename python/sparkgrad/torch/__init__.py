"""PyTorch jobs started by sparkgrad: `Distributor`, PySpark's TorchDistributor on sparkgrad's launcher.

Importing this package does not import torch; the ranks do, when they run.
"""

from sparkgrad.torch.distributor import Distributor

__all__ = ["Distributor"]
