"""The host agent process (``python -m monarch_nb.agent``); imports only ``_common``."""
