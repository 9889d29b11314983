"""sparkgrad on Databricks: notebooks run locally with the dbutils they use, and the REST client.

```python
from sparkgrad.databricks import Client, run_notebook

result = run_notebook("notebooks/02_scheduled_training_job.py", {"epochs": "1"}, timeout=600)
result.exit_value                       # what dbutils.notebook.exit returned
client = Client()                       # DATABRICKS_HOST/TOKEN, ~/.databrickscfg, or the notebook
client.workspace_import("/Users/me/train", source, overwrite=True)
```

Names load on first use, so ``import sparkgrad`` stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use by __getattr__ below; named here for type checkers and the API reference
    from sparkgrad.databricks.client import Client, notebook_job
    from sparkgrad.databricks.config import Config, resolve_config
    from sparkgrad.databricks.dbutils import fuse_path, require_input, secret_variable
    from sparkgrad.databricks.notebook import (
        export_ipynb,
        from_ipynb,
        ipynb_text,
        parse_source,
        read_notebook,
        to_ipynb,
    )
    from sparkgrad.databricks.runner import NotebookResult, run_notebook

_EXPORTS = {
    "run_notebook": "sparkgrad.databricks.runner",
    "NotebookResult": "sparkgrad.databricks.runner",
    "parse_source": "sparkgrad.databricks.notebook",
    "read_notebook": "sparkgrad.databricks.notebook",
    "to_ipynb": "sparkgrad.databricks.notebook",
    "from_ipynb": "sparkgrad.databricks.notebook",
    "ipynb_text": "sparkgrad.databricks.notebook",
    "export_ipynb": "sparkgrad.databricks.notebook",
    "secret_variable": "sparkgrad.databricks.dbutils",
    "fuse_path": "sparkgrad.databricks.dbutils",
    "require_input": "sparkgrad.databricks.dbutils",
    "Client": "sparkgrad.databricks.client",
    "notebook_job": "sparkgrad.databricks.client",
    "Config": "sparkgrad.databricks.config",
    "resolve_config": "sparkgrad.databricks.config",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The names of _EXPORTS, written out so that static readers (type checkers, the API reference) see them; in
# the order the API reference lists them.
__all__ = [
    "run_notebook",
    "NotebookResult",
    "require_input",
    "fuse_path",
    "secret_variable",
    "parse_source",
    "read_notebook",
    "to_ipynb",
    "ipynb_text",
    "from_ipynb",
    "export_ipynb",
    "Client",
    "notebook_job",
    "Config",
    "resolve_config",
]
