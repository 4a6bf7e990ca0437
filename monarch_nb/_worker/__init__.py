"""Worker-side code: the process main loop, its wire thread, rank namespaces."""
