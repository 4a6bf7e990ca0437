"""Entry point of a worker process: ``python -m monarch_nb.worker`` (bootstrap on stdin)."""

from monarch_nb._worker._main import main

if __name__ == "__main__":
    main()
