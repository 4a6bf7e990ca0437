"""The worker process: its main loop and inbox, the actors it hosts and their
calls, cells and rank namespaces, its wire thread. Never imports ``_controller``."""
