"""``python -m monarch_nb.agent``: run this host's agent (see monarch_nb._agent._main)."""

from monarch_nb._agent._main import main

if __name__ == "__main__":
    main()
