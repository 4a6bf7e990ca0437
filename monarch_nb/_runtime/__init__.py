"""The actor runtime, the same in every process: the Actor class and endpoints,
calls in flight (``_pending``), references to meshes and the peer meshes they
become, ports, this process's peer node, the running context, cells' source
(``_cell_source``: where a cell is compiled). Imports ``_model`` and ``_wire``."""
