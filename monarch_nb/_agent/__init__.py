"""The host agent process (``python -m monarch_nb.agent``); imports the layers below
the processes (``_model``, ``_wire``, ``_runtime``, ``_services``), never the controller."""
