"""kooi example: a tiny Python package whose tests run in a bubblewrap jail."""


def mean(values: list[float]) -> float:
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / len(values)
