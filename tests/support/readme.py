"""README's code examples, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(heading: str, count: int) -> list[str]:
    """The ```python blocks of README's section ``heading`` (a whole heading line, ``## ...`` or
    ``### ...``, up to the next heading of its level or higher); there must be ``count``."""
    text = README.read_text()
    assert heading in text, f"README has no section {heading!r}"
    level = heading.split(" ", 1)[0]
    section = re.split(rf"\n#{{1,{len(level)}}} ", text.split(heading, 1)[1], maxsplit=1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == count, f"expected {count} python examples in {heading!r}, found {len(blocks)}"
    return blocks
