"""A library a rank imports, which shows its results with IPython.display.display
(as many plotting and data libraries do): imported by the workers of tests."""

from IPython.display import HTML, display


def report(rank: int) -> None:
    display(HTML(f"<b>report of rank {rank}</b>"))
