"""Prompts that show the effect: code and edits of given code accept long drafts; poems and random lists don't."""

RENAME_CODE = """Rename the variable x to count in this code and return only the code:

```python
def tally(items):
    x = 0
    for item in items:
        if item is not None:
            x += 1
    return x
```"""

TYPE_HINTS = """Add type hints to this function and return only the code:

```python
def scale(values, factor):
    result = []
    for v in values:
        result.append(v * factor)
    return result
```"""

EXAMPLES: list[tuple[str, str]] = [
    ("high acceptance · edit given code", RENAME_CODE),
    ("high acceptance · add type hints", TYPE_HINTS),
    ("high acceptance · code", "Write a Python function is_prime(n) with a docstring."),
    ("high acceptance · count", "Count from 1 to 30, separated by commas."),
    ("low acceptance · poem", "Write a short poem about a lighthouse keeper who collects lost socks."),
    ("low acceptance · random list", "List twelve random, unrelated nouns, one per line."),
]


def example_inputs() -> list[list[str]]:
    return [[prompt] for _, prompt in EXAMPLES]


def example_labels() -> list[str]:
    return [label for label, _ in EXAMPLES]
