"""Controller-side code: the I/O thread, process meshes, actors, calls, events."""
