"""The wire: how processes reach each other, safely. Sockets and Unix links,
signed messages (``_signed``: where every message is signed and checked), the
typed messages (``_messages``), serialisation, keys and run directories, the
optional C fast paths. Imports only ``_model`` (docs/layout.md)."""
