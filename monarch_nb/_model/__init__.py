"""The mesh model: shapes and points, per-rank values (ValueMesh) and their folding,
errors, the one Future type, durations. Pure data and rules, no I/O: the lowest
layer, which every other imports (docs/layout.md)."""
