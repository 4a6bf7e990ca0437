"""Code both sides run: the wire, messages, plain data, errors, the Future type."""
