"""The README's quickstart runs as written (a README that breaks is a bug)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_code_blocks_run():
    text = README.read_text()
    section = text[text.index("## Quickstart") : text.index("## The samplers")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 2
    namespace = {}
    exec(compile("\n".join(blocks), "README.md#quickstart", "exec"), namespace)  # noqa: S102 - our own README
    result = namespace["result"]  # the last block: 4000 RW-MH chains on N(0, I_2)
    assert result.trace.shape == (1000, 4000, 2)
    assert namespace["cenlmc"].__class__.__name__ == "SamplingAlgorithm"
