"""The controller process: its I/O thread and client socket, process and actor
meshes, the process group's roles (launching, ``_liveness``: where a rank's
failure is detected, restarts, worker messages), calls, cells, events, jobs.
Never imported by ``_worker`` or ``_agent``."""
