"""The README's quickstart really runs."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_runs(tmp_path, monkeypatch, capsys):
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python code block"
    quickstart = blocks[0]
    assert len([line for line in quickstart.splitlines() if line.strip()]) <= 12
    monkeypatch.chdir(tmp_path)
    exec(compile(quickstart, "README quickstart", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[") and "True" in out[0]
    assert (tmp_path / "model.safetensors").exists()


def test_joint_model_example_runs(capsys):
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    joint = next(b for b in blocks if "adapt(" in b)
    exec(compile(joint, "README joint example", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("[") and len(lines) >= 3
