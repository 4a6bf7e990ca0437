"""Reading mesh tensors' values on the controller, as Monarch's ``monarch.fetch``:
``fetch_shard`` (a future), ``inspect`` (the value), ``show`` (printed), and
``call_on_shard_and_fetch`` (a remote function's result from one rank).

Importing this module imports torch (the tensor engine).
"""

from .tensor._api import fetch_shard, inspect, show
from .tensor._remote import call_on_shard_and_fetch

__all__ = ["call_on_shard_and_fetch", "fetch_shard", "inspect", "show"]
